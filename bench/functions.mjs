// Where the instructions (or L1 cache misses) of one bench/count.ts case go, per function, per
// element per stage. valgrind's callgrind counts every instruction by address; V8's
// `--perf-basic-prof` map names the JIT code at those addresses (`*` optimised, `^` baseline,
// `~` interpreted), and V8's builtins and C++ are named by callgrind itself. Like
// bench/instructions.mjs it runs the workload twice, with 0 and COUNT_RUNS measured rounds after
// the same warm-up, and divides the difference, so warm-up and compilation cancel out.
// A function's figure is its own cost with what V8 inlined into it, not what it calls.
//
//     node bench/functions.mjs async-c16             # instructions
//     node bench/functions.mjs async-c16 --misses    # simulated L1 data-cache misses (read + write)
//
// COUNT_N, COUNT_RUNS, COUNT_STAGES, COUNT_MIX as in bench/count.ts; TOP (default 30) rows.
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const args = process.argv.slice(2);
const which = args.find((arg) => !arg.startsWith('--')) ?? 'async-c1';
const misses = args.includes('--misses');
const n = Number(process.env.COUNT_N ?? 20_000);
const runs = Number(process.env.COUNT_RUNS ?? 4);
const stages = Number(process.env.COUNT_STAGES ?? 7);
const top = Number(process.env.TOP ?? 30);

const dir = mkdtempSync(join(tmpdir(), 'sluice-functions-'));
const bundle = join(dir, 'count.mjs');
execFileSync('node_modules/.bin/esbuild', ['bench/count.ts', '--bundle', '--platform=node', '--format=esm', '--conditions=sluice-source', `--outfile=${bundle}`, '--log-level=warning']);

/** Runs the case under callgrind; resolves with the output file and the perf map of that run. */
function profile(rounds) {
  const out = join(dir, `callgrind-${rounds}.out`);
  const tool = ['--tool=callgrind', '--dump-instr=yes', `--callgrind-out-file=${out}`, ...(misses ? ['--cache-sim=yes'] : [])];
  const node = ['--single-threaded', '--hash-seed=1', '--random-seed=1', '--perf-basic-prof', bundle];
  return new Promise((resolve, reject) => {
    const child = spawn('valgrind', [...tool, process.execPath, ...node], {
      env: { ...process.env, COUNT_CASE: which, COUNT_N: String(n), COUNT_RUNS: String(rounds) },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('close', (code) => {
      if (code !== 0) return reject(new Error(`${which}: valgrind exit ${code}\n${err.slice(-2000)}`));
      const pid = /^pid: (\d+)/m.exec(readFileSync(out, 'utf8').slice(0, 4096))?.[1];
      const map = join(dir, `perf-${rounds}.map`);
      renameSync(`/tmp/perf-${pid}.map`, map);
      resolve({ out, map });
    });
  });
}

/** JIT code ranges from a perf map, sorted by start. */
function loadMap(path) {
  const ranges = [];
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const match = /^([0-9a-f]+) ([0-9a-f]+) (.*)$/.exec(line);
    if (match) ranges.push([parseInt(match[1], 16), parseInt(match[2], 16), match[3].replace(/^(JS|LazyCompile|Function):/, '')]);
  }
  return ranges.sort((a, b) => a[0] - b[0]);
}

function nameAt(ranges, address) {
  let lo = 0;
  let hi = ranges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (ranges[mid][0] <= address) lo = mid + 1;
    else hi = mid - 1;
  }
  const range = ranges[hi];
  return range && address < range[0] + range[1] ? range[2].replace(/ file:\/\/\S*\//, ' ') : '[unnamed JIT code]';
}

/**
 * Self cost per function from a callgrind file (`positions: instr line`): names are compressed
 * (`fn=(id) name` once, `fn=(id)` after), a `calls=` line's next cost line is the call's
 * inclusive cost (skipped), addresses are absolute (`0x…`) or relative (`+n`, `-n`, `*`).
 */
function selfCosts(path, ranges) {
  const names = new Map();
  const totals = new Map();
  const text = readFileSync(path, 'utf8');
  const columns = /^events: (.*)$/m.exec(text)[1].split(' ');
  const wanted = misses ? ['D1mr', 'D1mw'].map((event) => columns.indexOf(event)) : [columns.indexOf('Ir')];
  let fn = '?';
  let address = 0;
  let skip = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('fn=') || line.startsWith('cfn=')) {
      const match = /^c?fn=\((\d+)\)(?: (.*))?$/.exec(line);
      if (match[2] !== undefined) names.set(match[1], match[2]);
      if (line.startsWith('fn=')) fn = names.get(match[1]) ?? '?';
      continue;
    }
    if (line.startsWith('calls=')) {
      skip = true;
      continue;
    }
    const first = line[0];
    if (first === undefined || !'0123456789+-*'.includes(first)) continue;
    const parts = line.split(' ');
    const position = parts[0];
    if (position.startsWith('0x')) address = parseInt(position, 16);
    else if (first === '+' || first === '-') address += (first === '+' ? 1 : -1) * Number(position.slice(1));
    if (skip) {
      skip = false;
      continue;
    }
    let cost = 0;
    for (const index of wanted) cost += Number(parts[2 + index] ?? 0);
    if (cost === 0) continue;
    const key = fn === '?' || fn.startsWith('0x') ? nameAt(ranges, address) : fn;
    totals.set(key, (totals.get(key) ?? 0) + cost);
  }
  return totals;
}

const [base, measured] = [await profile(0), await profile(runs)];
const before = selfCosts(base.out, loadMap(base.map));
const after = selfCosts(measured.out, loadMap(measured.map));
const per = runs * n * stages;
const rows = [...new Set([...before.keys(), ...after.keys()])]
  .map((name) => [name, ((after.get(name) ?? 0) - (before.get(name) ?? 0)) / per])
  .sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
const total = rows.reduce((sum, [, cost]) => sum + cost, 0);
console.log(`${which}: ${misses ? 'L1 data misses (simulated)' : 'instructions'} per element per stage, by function (self, with inlined callees)`);
for (const [name, cost] of rows.slice(0, top)) console.log(`${cost.toFixed(1).padStart(9)}  ${name.slice(0, 100)}`);
console.log(`${total.toFixed(1).padStart(9)}  total`);
