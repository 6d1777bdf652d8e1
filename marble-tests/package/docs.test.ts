/**
 * Docs are tested: every TypeScript code block in README.md and docs/**\/*.md type-checks.
 *
 * Each fenced block whose info string starts with `ts` or `typescript` is checked as its own module
 * (even without imports) under the repo's tsconfig.json — strict, NodeNext, verbatimModuleSyntax — in
 * one in-process TypeScript program over all blocks. `import … from 'sluice'` and `'sluice/testing'`
 * resolve to src/ exactly as they do for examples/: through the package's self-reference (its "name"
 * and "exports") with the `sluice-source` condition that tsconfig.json lists in customConditions.
 * A failing block is reported as `file:line` of its opening fence, then each diagnostic at its own
 * `file:line:column` in the markdown.
 *
 * Markers, written after the language in the info string:
 *
 *   ```ts               type-checked.
 *   ```ts runnable      type-checked, then also run: `node --conditions=sluice-source --import tsx
 *                       <block>.ts` in a child process with the repo root as its cwd (so data/ and
 *                       models/ resolve as they do for examples/); it must exit 0 within 30 s.
 *   ```ts no-check      skipped: the one escape hatch, for a snippet that is wrong on purpose (showing
 *                       an error, a signature with `options?`, …).
 *
 * `typescript` works wherever `ts` does. Any other word after the language fails the block, so that a
 * typo (`runable`, `nocheck`) cannot silently switch the check off; so does `// @ts-nocheck` or
 * `// @ts-ignore` inside a block (`// @ts-expect-error` is fine: it fails when the error goes away).
 * A fragment that uses names it does not define can declare them: `declare const prompts: string[];`.
 * Blocks in other languages (sh, json, text, none) are not checked, with one exception: README.md must
 * not show a `node --conditions=sluice-source …` command, since that condition only resolves inside
 * this repository (it points 'sluice' at src/*.ts), not for someone who installed the package.
 *
 * The block files live (virtually for the check, on disk for runnable blocks) in a temporary,
 * git-ignored directory under the repo root, `.scratch/docs-test-*`: the self-reference that resolves
 * 'sluice', and node_modules for rxjs, only work from inside the repo, not from os.tmpdir().
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { availableParallelism } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import ts from 'typescript';

const ROOT = fileURLToPath(new URL('../../', import.meta.url)).replace(/\/$/, '');
const RUN_TIMEOUT_MS = 30_000;
const MARKERS = new Set(['no-check', 'runnable']);

interface Block {
  /** Markdown file, relative to the repo root. */
  readonly doc: string;
  /** 1-based line of the opening fence. */
  readonly line: number;
  /** Spaces before the opening fence (a block inside a list item); stripped from its lines. */
  readonly indent: number;
  /** The info string as written, e.g. `ts runnable`. */
  readonly info: string;
  readonly markers: readonly string[];
  readonly code: string;
  /** Where the block's module lives: virtual for the check, written out for a runnable block. */
  fileName: string;
}

function markdownFiles(): string[] {
  const files = existsSync(join(ROOT, 'README.md')) ? ['README.md'] : [];
  (function walk(dir: string) {
    if (!existsSync(dir)) return;
    for (const entry of readdirSync(dir).sort()) {
      const path = join(dir, entry);
      if (statSync(path).isDirectory()) walk(path);
      else if (entry.endsWith('.md')) files.push(relative(ROOT, path));
    }
  })(join(ROOT, 'docs'));
  return files;
}

interface Fence {
  readonly line: number;
  readonly indent: number;
  readonly info: string;
  readonly lines: readonly string[];
}

/** CommonMark fences (``` or ~~~, three or more, any indent so that list items count). */
function fences(text: string): Fence[] {
  const lines = text.split(/\r?\n/);
  const found: Fence[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^( *)(`{3,}|~{3,})(.*)$/.exec(lines[i]!);
    if (!open) continue;
    const [, spaces = '', marker = '', info = ''] = open;
    if (marker[0] === '`' && info.includes('`')) continue; // inline code, not a fence
    const body: string[] = [];
    let j = i + 1;
    for (; j < lines.length; j++) {
      const close = /^ *(`{3,}|~{3,}) *$/.exec(lines[j]!);
      if (close && close[1]![0] === marker[0] && close[1]!.length >= marker.length) break;
      body.push(lines[j]!.replace(new RegExp(`^ {0,${spaces.length}}`), ''));
    }
    found.push({ line: i + 1, indent: spaces.length, info: info.trim(), lines: body });
    i = j;
  }
  return found;
}

function tsBlocks(doc: string, text: string): Block[] {
  const blocks: Block[] = [];
  for (const fence of fences(text)) {
    const [language = '', ...markers] = fence.info.split(/[\s,]+/).filter(Boolean);
    if (!['ts', 'typescript'].includes(language.toLowerCase())) continue;
    const name = `${doc.replace(/[^A-Za-z0-9]+/g, '_')}_L${fence.line}.ts`;
    blocks.push({ doc, line: fence.line, indent: fence.indent, info: fence.info, markers, code: `${fence.lines.join('\n')}\n`, fileName: name });
  }
  return blocks;
}

/** Problems that are not TypeScript's to find: unknown markers and in-block escape hatches. */
function conventionProblems(block: Block): string[] {
  const problems: string[] = [];
  for (const marker of block.markers) {
    if (!MARKERS.has(marker)) problems.push(`unknown marker "${marker}" after the language (known: ${[...MARKERS].join(', ')})`);
  }
  if (block.markers.includes('no-check') && block.markers.includes('runnable')) {
    problems.push('"no-check" and "runnable" together: a block that is not checked is not run either');
  }
  block.code.split('\n').forEach((text, index) => {
    const hatch = /@ts-(nocheck|ignore)\b/.exec(text);
    if (hatch) {
      problems.push(`${block.doc}:${block.line + 1 + index}: // @ts-${hatch[1]} in a docs block: mark the block "ts no-check", or use // @ts-expect-error`);
    }
  });
  return problems;
}

function compilerOptions(): ts.CompilerOptions {
  const configPath = join(ROOT, 'tsconfig.json');
  const read = ts.readConfigFile(configPath, (path) => ts.sys.readFile(path));
  if (read.error) throw new Error(ts.formatDiagnostic(read.error, formatHost));
  const parsed = ts.parseJsonConfigFileContent(read.config, ts.sys, ROOT, undefined, configPath);
  const errors = parsed.errors.filter((error) => error.code !== 18003); // "no inputs found" cannot happen, but is no concern here
  if (errors.length > 0) throw new Error(ts.formatDiagnostics(errors, formatHost));
  return {
    ...parsed.options,
    noEmit: true,
    declaration: false,
    declarationMap: false,
    sourceMap: false,
    incremental: false,
    composite: false,
    // Every block is its own module, imports or not: no block's names leak into another's.
    moduleDetection: ts.ModuleDetectionKind.Force,
  };
}

const formatHost: ts.FormatDiagnosticsHost = {
  getCanonicalFileName: (fileName) => fileName,
  getCurrentDirectory: () => ROOT,
  getNewLine: () => '\n',
};

interface Checked {
  /** Problems per block, keyed by the block; empty when it passed. */
  readonly problems: Map<Block, string[]>;
  /** Diagnostics about the setup itself (options, globals). */
  readonly global: string[];
  readonly program: ts.Program;
}

/** Type-checks every block not marked no-check; checks the markers and in-block escape hatches of all. */
function check(blocks: readonly Block[], options: ts.CompilerOptions): Checked {
  const virtual = new Map(blocks.filter((block) => !block.markers.includes('no-check')).map((block) => [block.fileName, block]));
  const host = ts.createCompilerHost(options, true);
  const { getSourceFile, fileExists, readFile } = host;
  host.getSourceFile = (fileName, languageVersionOrOptions, onError, shouldCreate) => {
    const block = virtual.get(fileName);
    if (block) return ts.createSourceFile(fileName, block.code, languageVersionOrOptions, true);
    return getSourceFile.call(host, fileName, languageVersionOrOptions, onError, shouldCreate);
  };
  host.fileExists = (fileName) => virtual.has(fileName) || fileExists.call(host, fileName);
  host.readFile = (fileName) => virtual.get(fileName)?.code ?? readFile.call(host, fileName);

  const program = ts.createProgram({ rootNames: [...virtual.keys()], options, host });
  const global = [...program.getOptionsDiagnostics(), ...program.getGlobalDiagnostics()].map((d) => ts.formatDiagnostic(d, formatHost).trim());
  const problems = new Map<Block, string[]>();
  for (const block of blocks) {
    const found = conventionProblems(block);
    if (!virtual.has(block.fileName)) {
      problems.set(block, found);
      continue;
    }
    const sourceFile = program.getSourceFile(block.fileName);
    if (!sourceFile) {
      found.push('the block is not in the program');
    } else {
      const byPosition = (a: ts.Diagnostic, b: ts.Diagnostic) => (a.start ?? -1) - (b.start ?? -1);
      // Syntax errors first: when there are any, they explain most of what follows.
      const diagnostics = [
        ...[...program.getSyntacticDiagnostics(sourceFile)].sort(byPosition),
        ...[...program.getSemanticDiagnostics(sourceFile)].sort(byPosition),
      ];
      for (const diagnostic of diagnostics) {
        const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n    ');
        const category = ts.DiagnosticCategory[diagnostic.category].toLowerCase();
        if (diagnostic.start === undefined) {
          found.push(`${category} TS${diagnostic.code}: ${message}`);
          continue;
        }
        const { line, character } = sourceFile.getLineAndCharacterOfPosition(diagnostic.start);
        found.push(`${block.doc}:${block.line + 1 + line}:${block.indent + character + 1} ${category} TS${diagnostic.code}: ${message}`);
      }
    }
    problems.set(block, found);
  }
  return { problems, global, program };
}

interface RunResult {
  readonly ok: boolean;
  readonly report: string;
}

function run(block: Block): Promise<RunResult> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.NODE_TEST_CONTEXT; // the block is a program of its own, not a child of this test run
  const started = Date.now();
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      ['--conditions=sluice-source', '--import', 'tsx', block.fileName],
      { cwd: ROOT, env, timeout: RUN_TIMEOUT_MS, killSignal: 'SIGKILL', maxBuffer: 16 * 1024 * 1024, encoding: 'utf8' },
      (error, stdout, stderr) => {
        const ms = Date.now() - started;
        if (!error) return resolve({ ok: true, report: `ran in ${ms} ms` });
        const why = error.killed ? `did not exit within ${RUN_TIMEOUT_MS / 1000} s (killed)` : `exited with ${error.code ?? error.signal}`;
        const name = `<block at ${block.doc}:${block.line}>`;
        const tail = (text: string) =>
          text.split(pathToFileURL(block.fileName).href).join(name).split(block.fileName).join(name).trim().split('\n').slice(-20).join('\n      ');
        const output = [stdout && `stdout:\n      ${tail(stdout)}`, stderr && `stderr:\n      ${tail(stderr)}`].filter(Boolean).join('\n    ');
        const where = `(line n of the block is ${block.doc}:${block.line}+n)`;
        resolve({ ok: false, report: `${block.doc}:${block.line}: runnable block ${why} after ${ms} ms ${where}${output ? `\n    ${output}` : ''}` });
      },
    );
  });
}

/** Fails the current test with `message` alone: a stack into this file says nothing about the doc. */
function fail(message: string): never {
  const error = new Error(message);
  error.stack = message;
  throw error;
}

/** Runs `work` over `items`, at most `limit` at a time. */
async function pool<T, R>(items: readonly T[], limit: number, work: (item: T) => Promise<R>): Promise<Map<T, R>> {
  const results = new Map<T, R>();
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const item = items[next++]!;
        results.set(item, await work(item));
      }
    }),
  );
  return results;
}

const docs = markdownFiles();
const blocksByDoc = new Map(docs.map((doc) => [doc, tsBlocks(doc, readFileSync(join(ROOT, doc), 'utf8'))]));
const allBlocks = [...blocksByDoc.values()].flat();
const runnableBlocks = allBlocks.filter((block) => block.markers.includes('runnable') && !block.markers.includes('no-check'));

// The block modules live in a git-ignored directory inside the repo (see the header for why).
const blockDir = join(ROOT, '.scratch', `docs-test-${process.pid}-${randomBytes(4).toString('hex')}`);
for (const block of allBlocks) block.fileName = join(blockDir, block.fileName);

let checkedOnce: Promise<Checked> | undefined;
const checked = (): Promise<Checked> => (checkedOnce ??= Promise.resolve().then(() => check(allBlocks, compilerOptions())));

let ranOnce: Promise<Map<Block, RunResult>> | undefined;
const ran = (): Promise<Map<Block, RunResult>> =>
  (ranOnce ??= (async () => {
    if (runnableBlocks.length === 0) return new Map<Block, RunResult>();
    mkdirSync(join(ROOT, '.scratch'), { recursive: true });
    mkdirSync(blockDir);
    try {
      for (const block of runnableBlocks) writeFileSync(block.fileName, block.code);
      return await pool(runnableBlocks, Math.max(1, availableParallelism()), run);
    } finally {
      rmSync(blockDir, { recursive: true, force: true });
      try {
        rmdirSync(join(ROOT, '.scratch')); // only if nothing else lives there
      } catch {}
    }
  })());

test("docs checker: tsconfig.json loads and 'sluice' resolves to the repo sources", async () => {
  const { global } = await checked();
  assert.deepEqual(global, [], `compiler setup problems:\n${global.join('\n')}`);
  const options = compilerOptions();
  const from = join(blockDir, 'probe.ts');
  for (const [specifier, expected] of [
    ['sluice', 'src/index.ts'],
    ['sluice/testing', 'src/testing/index.ts'],
  ] as const) {
    const resolved = ts.resolveModuleName(specifier, from, options, ts.sys, undefined, undefined, ts.ModuleKind.ESNext).resolvedModule;
    assert.equal(
      resolved && relative(ROOT, resolved.resolvedFileName),
      expected,
      `'${specifier}' should resolve to ${expected} through package.json "exports" and the sluice-source condition`,
    );
  }
});

for (const doc of docs) {
  const blocks = blocksByDoc.get(doc)!;
  test(doc, async (t) => {
    const skipped = blocks.filter((block) => block.markers.includes('no-check'));
    const runnable = blocks.filter((block) => runnableBlocks.includes(block));

    if (doc === 'README.md') {
      await t.test('shows no `node --conditions=sluice-source` command (it only resolves inside this repo)', () => {
        const text = readFileSync(join(ROOT, doc), 'utf8');
        const lineOf = (index: number) => text.slice(0, index).split('\n').length;
        const pattern = /\bnode\b[^`\n]{0,200}(?:\n[^`\n]{0,200})?(?:--conditions|-C)[=\s]+sluice-source|NODE_OPTIONS=\S*sluice-source/g;
        const lines = text.split('\n');
        const hits = [...text.matchAll(pattern)].map((match) => {
          const line = lineOf(match.index! + match[0].search(/sluice-source/));
          const shown = lines[line - 1]!.trim();
          return `  ${doc}:${line}: ${shown.length > 160 ? `${shown.slice(0, 157)}...` : shown}`;
        });
        if (hits.length > 0) {
          fail(
            `README.md shows ${hits.length} command(s) with --conditions=sluice-source. That condition points 'sluice' at src/*.ts and ` +
              `only resolves inside this repository; show an npm script (npm run demo, npm run bench, …) or a command that works ` +
              `for someone who installed the package:\n${hits.join('\n')}`,
          );
        }
      });
    }

    await t.test(
      `${blocks.length - skipped.length} TypeScript block(s) type-check${skipped.length ? ` (${skipped.length} marked no-check)` : ''}`,
      async () => {
        const { problems } = await checked();
        const failures = blocks
          .filter((block) => (problems.get(block)?.length ?? 0) > 0)
          .map((block) => `${block.doc}:${block.line}: \`\`\`${block.info} block fails:\n  ${problems.get(block)!.join('\n  ')}`);
        if (failures.length > 0) fail(`${failures.length} block(s) in ${doc} fail:\n\n${failures.join('\n\n')}\n`);
      },
    );

    if (runnable.length > 0) {
      await t.test(`${runnable.length} runnable block(s) exit 0`, async () => {
        const results = await ran();
        const failures = runnable.map((block) => results.get(block)!).filter((result) => !result.ok);
        if (failures.length > 0) fail(`${failures.length} runnable block(s) in ${doc} fail:\n\n${failures.map((f) => f.report).join('\n\n')}\n`);
      });
    }
  });
}
