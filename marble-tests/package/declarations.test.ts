/**
 * The emitted declarations a user's TypeScript reads do not show zod's machinery. The test emits
 * them as the build does (`tsconfig.build.json`, `stripInternal`) into a temporary directory, walks
 * every .d.ts reachable from the package's `exports` "types", and fails when one imports zod.
 *
 * Option types are interfaces written out, which the schemas satisfy (`Holds<SchemaMatches<…>>`,
 * src/core/zod.ts); the schemas and parsed shapes are `@internal`. Otherwise a hover shows zod's
 * types and a zod upgrade is a breaking change of sluice. The exception: modules whose API takes a
 * user's own zod schema (`jsonOutput(schema)`, a NATS contract...) name it, and only as `ZodType`,
 * `ZodError` or the `input`/`output` of that schema.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');

/** Modules whose API takes a user's zod schema, relative to the declaration root. */
const TAKE_A_USERS_SCHEMA = new Set([
  'src/ai/stages/json-output.d.ts',
  'src/ai/stages/assemble.d.ts',
  'src/ai/rag/vector-index.d.ts',
  'src/ai/pipelines/json-worker.d.ts',
  'src/nats/contract.d.ts',
  'src/nats/link.d.ts',
]);
/** What those modules may name of zod: a schema, its error, and what it takes or gives. */
const USER_SCHEMA_NAMES = new Set(['ZodType', 'ZodError', 'input', 'output', 'infer']);

const ZOD_IMPORT = /(?:from\s*|import\s*\(\s*)['"]zod(?:\/[^'"]*)?['"]/;

/** The declaration files of the package's entry points, from package.json `exports`. */
function entryDeclarations(out: string): string[] {
  const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { exports: Record<string, { types?: string } | string> };
  return Object.values(manifest.exports)
    .flatMap((target) => (typeof target === 'object' && target.types !== undefined ? [target.types] : []))
    .map((types) => join(out, relative('dist', types)));
}

/** Every .d.ts reachable from `entries` through relative imports and re-exports, with the file that first reached it. */
function reachable(entries: readonly string[]): Map<string, string | undefined> {
  const found = new Map<string, string | undefined>(entries.map((entry) => [entry, undefined]));
  const queue = [...entries];
  while (queue.length > 0) {
    const file = queue.shift()!;
    assert.ok(existsSync(file), `${file} was not emitted (reached from ${found.get(file) ?? 'package.json exports'})`);
    for (const match of readFileSync(file, 'utf8').matchAll(/(?:from\s*|import\s*\(\s*)['"](\.{1,2}\/[^'"]+)['"]/g)) {
      const next = join(dirname(file), match[1]!.replace(/\.js$/, '.d.ts'));
      if (found.has(next)) continue;
      found.set(next, file);
      queue.push(next);
    }
  }
  return found;
}

/** The code of a declaration file, its comments (TSDoc examples name `z.object`) removed. */
const code = (text: string) => text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '');

/** The names a file uses of zod: `z.X`, `import("zod").X`, and what it imports by name from 'zod'. */
function zodNames(text: string): Set<string> {
  const names = new Set<string>();
  const namespaces = [...text.matchAll(/import\s+(?:type\s+)?\*\s+as\s+(\w+)\s+from\s*['"]zod['"]/g)].map((m) => m[1]!);
  for (const ns of namespaces) for (const m of text.matchAll(new RegExp(`\\b${ns}\\.(\\w+)`, 'g'))) names.add(m[1]!);
  for (const m of text.matchAll(/import\(\s*['"]zod(?:\/[^'"]*)?['"]\s*\)\.(\w+)/g)) names.add(m[1]!);
  for (const m of text.matchAll(/import\s+(?:type\s+)?\{([^}]*)\}\s+from\s*['"]zod(?:\/[^'"]*)?['"]/g)) {
    for (const part of m[1]!.split(',')) {
      const name = part
        .trim()
        .replace(/^type\s+/, '')
        .split(/\s+as\s+/)[0];
      if (name) names.add(name);
    }
  }
  if (/['"]zod\/[^'"]*['"]/.test(text)) names.add('zod/<subpath>');
  return names;
}

describe('the emitted declarations', { timeout: 180_000 }, () => {
  let out = '';
  let files = new Map<string, string | undefined>();

  before(async () => {
    out = mkdtempSync(join(tmpdir(), 'sluice-dts-'));
    await new Promise<void>((resolve, reject) => {
      execFile(
        process.execPath,
        [TSC, '-p', 'tsconfig.build.json', '--emitDeclarationOnly', '--outDir', out],
        { cwd: ROOT, maxBuffer: 16 * 2 ** 20 },
        (error, stdout, stderr) => (error === null ? resolve() : reject(new Error(`tsc failed:\n${stdout}${stderr}`))),
      );
    });
    files = reachable(entryDeclarations(out));
  });

  after(() => {
    if (out !== '') rmSync(out, { recursive: true, force: true });
  });

  it('reach a declaration file of every entry point', () => {
    assert.ok(files.size > 6, `only ${files.size} declaration files reachable from package.json exports`);
  });

  it('import zod only where the API takes a user’s zod schema', () => {
    const leaks = [...files]
      .filter(([file]) => ZOD_IMPORT.test(code(readFileSync(file, 'utf8'))) && !TAKE_A_USERS_SCHEMA.has(relative(out, file)))
      .map(([file, from]) => `${relative(out, file)} (reached from ${from === undefined ? 'package.json exports' : relative(out, from)})`);
    assert.deepEqual(leaks, [], 'public declarations import zod: write the option type as an interface the schema satisfies, and mark the schema @internal');
  });

  it('name nothing of zod but a user’s schema, its error, and its input or output', () => {
    const shown: string[] = [];
    for (const [file] of files) {
      const extra = [...zodNames(code(readFileSync(file, 'utf8')))].filter((name) => !USER_SCHEMA_NAMES.has(name));
      if (extra.length > 0) shown.push(`${relative(out, file)}: ${extra.join(', ')}`);
    }
    assert.deepEqual(shown, [], 'public declarations show zod internals');
  });
});
