// Instructions per element per stage, counted by valgrind (cachegrind, no cache
// simulation): steady whatever else the machine runs, unlike wall clocks. The workload
// (bench/count.ts) is bundled with esbuild first, so no transpiler runs in the count.
// Each case runs twice after the same warm-up, with 0 and COUNT_RUNS measured rounds;
// the difference is divided by COUNT_RUNS × COUNT_N × COUNT_STAGES (7). COUNT_MIX=0 warms up the measured case alone.
//
//     node bench/instructions.mjs [case ...]     # default: every case; COUNT_N, COUNT_WARM, COUNT_RUNS, COUNT_STAGES, COUNT_GC
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync } from 'node:fs';
import { join } from 'node:path';

const cases = process.argv.length > 2 ? process.argv.slice(2) : ['sync-sampled', 'sync-timed', 'async-c1', 'async-c16', 'rxjs-map'];
const n = Number(process.env.COUNT_N ?? 20_000);
const runs = Number(process.env.COUNT_RUNS ?? 4);
const stages = Number(process.env.COUNT_STAGES ?? 7);
const flags = [
  ...(process.env.COUNT_GC === '1' ? ['--expose-gc'] : []),
  ...(process.env.COUNT_NODE_FLAGS ?? '--single-threaded --hash-seed=1 --random-seed=1').split(' ').filter(Boolean),
];

// Inside the repo, so the bundle's lazy `require('zod')` (src/core/zod.ts) finds node_modules.
mkdirSync('node_modules/.cache', { recursive: true });
const bundle = join(mkdtempSync(join('node_modules', '.cache', 'sluice-count-')), 'count.mjs');
execFileSync('node_modules/.bin/esbuild', [
  'bench/count.ts',
  '--bundle',
  '--platform=node',
  '--format=esm',
  '--conditions=sluice-source',
  `--outfile=${bundle}`,
  '--log-level=warning',
]);

function count(which, rounds) {
  return new Promise((resolve, reject) => {
    const child = spawn('valgrind', ['--tool=cachegrind', '--cache-sim=no', '--cachegrind-out-file=/dev/null', process.execPath, ...flags, bundle], {
      env: { ...process.env, COUNT_CASE: which, COUNT_N: String(n), COUNT_RUNS: String(rounds) },
      stdio: ['ignore', 'inherit', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('close', (code) => {
      const match = /I\s+refs:\s+([\d,]+)/.exec(err);
      if (code !== 0 || !match) reject(new Error(`${which}: exit ${code}\n${err.slice(-2000)}`));
      else resolve(Number(match[1].replaceAll(',', '')));
    });
  });
}

for (const which of cases) {
  // One at a time: V8's heuristics read the clock, and a starved process counts a little more.
  const base = await count(which, 0);
  const measured = await count(which, runs);
  console.log(`${which.padEnd(14)} ${((measured - base) / runs / n / stages).toFixed(1).padStart(8)} instructions/element/stage`);
}
