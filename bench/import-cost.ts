/**
 * Import cost: a cold `import()` of the built core (`dist/src/index.js`, what `import 'sluice'`
 * loads from the published package) beside plain `rxjs`, which every sluice user imports anyway,
 * and `zod`, the core's one other dependency, which the core loads on its first validated option
 * (`import-core-first-stage` times the import plus one `stage()`, so that deferred cost shows).
 * Each sample is a fresh `node` process that imports
 * one module and reports the time the `import()` took (Node's own start-up excluded) and its RSS
 * afterwards; the modules take turns, sample by sample, so a busy moment of the machine hits all
 * of them alike. The median of BENCH_IMPORT_SAMPLES (default 9) is reported, after one unrecorded
 * round that warms the file cache.
 *
 * The core is measured from dist/: it is built first (`npm run build`) when dist/src/index.js is
 * missing or older than a file under src/.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { median } from './harness.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const CORE = join(ROOT, 'dist', 'src', 'index.js');

export interface ImportCase {
  readonly id: string;
  readonly label: string;
  /** What the child process imports: a bare specifier resolved from the repo root, or a file URL. */
  readonly specifier: string;
  /** Imported first, untimed. */
  readonly preload?: readonly string[];
  /** A statement run on the imported module `m`, timed with the import. */
  readonly use?: string;
}

export const importCases: readonly ImportCase[] = [
  { id: 'import-core', label: "sluice core (dist/src/index.js, 'sluice')", specifier: pathToFileURL(CORE).href },
  { id: 'import-rxjs', label: 'rxjs', specifier: 'rxjs' },
  { id: 'import-zod', label: 'zod', specifier: 'zod' },
  { id: 'import-core-first-stage', label: 'sluice core, then a first stage() (loads zod)', specifier: pathToFileURL(CORE).href, use: 'm.stage((x) => x);' },
];

export interface ImportResult {
  readonly id: string;
  readonly label: string;
  readonly samples: number;
  /** Median milliseconds of the `import()` itself. */
  readonly ms: number;
  readonly bestMs: number;
  /** Median RSS after the import, bytes. */
  readonly rss: number;
}

// Runs in the child: the preloads, then `await import(specifier)` timed on its own, then the RSS.
const childScript = (use = '') =>
  `for (const p of process.argv.slice(2)) await import(p); const t = performance.now(); const m = await import(process.argv[1]); ${use} const ms = performance.now() - t; process.stdout.write(JSON.stringify({ ms, rss: process.memoryUsage().rss }));`;

function newestUnder(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestUnder(path) : statSync(path).mtimeMs);
  }
  return newest;
}

/** Builds dist/ when it is missing or older than src/; returns what it did, for the progress line. */
export function ensureBuilt(): string {
  if (existsSync(CORE) && statSync(CORE).mtimeMs >= newestUnder(join(ROOT, 'src'))) return 'dist/ is up to date';
  execFileSync('npm', ['run', 'build', '--silent'], { cwd: ROOT, stdio: ['ignore', 'ignore', 'inherit'] });
  return 'built dist/ (npm run build)';
}

function sample({ specifier, preload = [], use }: ImportCase): { ms: number; rss: number } {
  const env = { ...process.env };
  delete env.NODE_OPTIONS; // a cold, plain `node`: no loader of the bench's own process
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', childScript(use), specifier, ...preload], { cwd: ROOT, env, encoding: 'utf8' });
  if (child.status !== 0) throw new Error(`importing ${specifier} failed (exit ${child.status}): ${child.stderr}`);
  return JSON.parse(child.stdout) as { ms: number; rss: number };
}

export function measureImportCost(cases: readonly ImportCase[], samples: number, onProgress?: (message: string) => void): ImportResult[] {
  for (const c of cases) sample(c);
  const figures = new Map(cases.map((c) => [c.id, [] as { ms: number; rss: number }[]]));
  for (let round = 0; round < samples; round++) {
    for (const c of cases) figures.get(c.id)!.push(sample(c));
  }
  return cases.map((c) => {
    const runs = figures.get(c.id)!;
    const result = {
      id: c.id,
      label: c.label,
      samples: runs.length,
      ms: median(runs.map((r) => r.ms)),
      bestMs: Math.min(...runs.map((r) => r.ms)),
      rss: median(runs.map((r) => r.rss)),
    };
    onProgress?.(`${c.id}: ${result.ms.toFixed(1)} ms, ${(result.rss / 2 ** 20).toFixed(1)} MB RSS`);
    return result;
  });
}
