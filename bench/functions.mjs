// Where the instructions (or L1 cache misses) of one bench/count.ts case go, per function, per
// element per stage. valgrind's callgrind counts every instruction by address; V8's
// `--perf-basic-prof` map names the JIT code at those addresses (`*` optimised, `^` baseline,
// `~` interpreted), and V8's builtins and C++ are named by callgrind itself. Like
// bench/instructions.mjs it runs the workload twice, with 0 and COUNT_RUNS measured rounds after
// the same warm-up, and divides the difference, so warm-up and compilation cancel out.
// A function's figure is its own cost with what V8 inlined into it, not what it calls.
//
//     node bench/functions.mjs async-c16                      # instructions
//     node bench/functions.mjs async-c16 --misses             # simulated L1 data-cache misses (read + write)
//     node bench/functions.mjs async-c1 --lines=startBuffered  # one function's cost by source line of the
//                                                             # bundle (its inlined callees' lines included)
//
// COUNT_N, COUNT_RUNS, COUNT_STAGES, COUNT_MIX, COUNT_GC as in bench/count.ts; TOP (default 30) rows.
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, openSync, readFileSync, renameSync } from 'node:fs';
import { join } from 'node:path';

const args = process.argv.slice(2);
const which = args.find((arg) => !arg.startsWith('--')) ?? 'async-c1';
const misses = args.includes('--misses');
/** `--lines=<name>`: V8's listing of its optimised code (`--print-opt-code`) maps each instruction to a source position. */
const linesOf = args.find((arg) => arg.startsWith('--lines='))?.slice('--lines='.length);
const n = Number(process.env.COUNT_N ?? 20_000);
const runs = Number(process.env.COUNT_RUNS ?? 4);
const stages = Number(process.env.COUNT_STAGES ?? 7);
const top = Number(process.env.TOP ?? 30);

// Inside the repo, so the bundle's lazy `require('zod')` (src/core/zod.ts) finds node_modules.
mkdirSync('node_modules/.cache', { recursive: true });
const dir = mkdtempSync(join('node_modules', '.cache', 'sluice-functions-'));
const bundle = join(dir, 'count.mjs');
execFileSync('node_modules/.bin/esbuild', [
  'bench/count.ts',
  '--bundle',
  '--platform=node',
  '--format=esm',
  '--conditions=sluice-source',
  `--outfile=${bundle}`,
  '--log-level=warning',
]);

/** Runs the case under callgrind; resolves with the output file and the perf map of that run. */
function profile(rounds) {
  const out = join(dir, `callgrind-${rounds}.out`);
  const tool = ['--tool=callgrind', '--dump-instr=yes', `--callgrind-out-file=${out}`, ...(misses ? ['--cache-sim=yes'] : [])];
  const node = [
    ...(process.env.COUNT_GC === '1' ? ['--expose-gc'] : []),
    '--single-threaded',
    '--hash-seed=1',
    '--random-seed=1',
    '--perf-basic-prof',
    ...(linesOf ? ['--print-opt-code'] : []),
    bundle,
  ];
  const listing = join(dir, `opt-code-${rounds}.txt`);
  return new Promise((resolve, reject) => {
    const child = spawn('valgrind', [...tool, process.execPath, ...node], {
      env: { ...process.env, COUNT_CASE: which, COUNT_N: String(n), COUNT_RUNS: String(rounds) },
      stdio: ['ignore', linesOf ? openSync(listing, 'w') : 'ignore', 'pipe'],
    });
    let err = '';
    child.stderr.on('data', (d) => (err += d));
    child.on('close', (code) => {
      if (code !== 0) return reject(new Error(`${which}: valgrind exit ${code}\n${err.slice(-2000)}`));
      const pid = /^pid: (\d+)/m.exec(readFileSync(out, 'utf8').slice(0, 4096))?.[1];
      const map = join(dir, `perf-${rounds}.map`);
      renameSync(`/tmp/perf-${pid}.map`, map);
      resolve({ out, map, listing });
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
 * Calls `visit(fn, address, cost)` for each instruction's self cost in a callgrind file
 * (`positions: instr line`): names are compressed (`fn=(id) name` once, `fn=(id)` after), a
 * `calls=` line's next cost line is the call's inclusive cost (skipped), addresses are absolute
 * (`0x…`) or relative (`+n`, `-n`, `*`).
 */
function eachCost(path, visit) {
  const names = new Map();
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
    if (cost !== 0) visit(fn, address, cost);
  }
}

/** Self cost per function, JIT code named through the perf map. */
function selfCosts(path, ranges) {
  const totals = new Map();
  eachCost(path, (fn, address, cost) => {
    const key = fn === '?' || fn.startsWith('0x') ? nameAt(ranges, address) : fn;
    totals.set(key, (totals.get(key) ?? 0) + cost);
  });
  return totals;
}

/**
 * Cost by source line of every optimised version of `name`, from V8's code listing: each
 * instruction's pc offset, and the table of source positions (offsets into the bundle) by pc.
 */
function lineCosts(codePath, cgPath, name) {
  const versions = [];
  let version;
  let section;
  for (const line of readFileSync(codePath, 'utf8').split('\n')) {
    if (line.startsWith('name = ')) {
      version = line.slice(7).trim() === name ? { start: 0, end: 0, pcs: new Map(), positions: [] } : undefined;
      if (version) versions.push(version);
      section = undefined;
    } else if (version === undefined) {
    } else if (line.startsWith('Instructions (size')) section = 'code';
    else if (line.startsWith('Source positions:')) section = 'positions';
    else if (line.startsWith('Inlined functions') || line.startsWith('--- End code')) section = undefined;
    else if (section === 'code') {
      const match = /^0x([0-9a-f]+)\s+([0-9a-f]+)\s/.exec(line);
      if (match) {
        const address = parseInt(match[1], 16);
        if (version.start === 0) version.start = address;
        version.end = address + 16;
        version.pcs.set(address, parseInt(match[2], 16));
      }
    } else if (section === 'positions') {
      const match = /^\s+([0-9a-f]+)\s+(\d+)/.exec(line);
      if (match) version.positions.push([parseInt(match[1], 16), Number(match[2])]);
    }
  }
  for (const v of versions) v.offsets = v.positions.map(([pc]) => pc);
  const source = readFileSync(bundle, 'utf8');
  const lineStarts = [0];
  for (let i = source.indexOf('\n'); i >= 0; i = source.indexOf('\n', i + 1)) lineStarts.push(i + 1);
  const lineOf = (offset) => upperBound(lineStarts, offset);
  const totals = new Map();
  eachCost(cgPath, (_fn, address, cost) => {
    for (const v of versions) {
      if (address < v.start || address >= v.end) continue;
      const pc = v.pcs.get(address);
      if (pc === undefined) return;
      const at = upperBound(v.offsets, pc) - 1;
      const key = at >= 0 ? lineOf(v.positions[at][1]) : 0;
      totals.set(key, (totals.get(key) ?? 0) + cost);
      return;
    }
  });
  const lines = source.split('\n');
  return new Map([...totals].map(([line, cost]) => [line === 0 ? '?' : `${String(line).padStart(6)}  ${lines[line - 1].trim()}`, cost]));
}

/** Index of the first element greater than `value` in a sorted array. */
function upperBound(sorted, value) {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (sorted[mid] <= value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

const [base, measured] = [await profile(0), await profile(runs)];
const before = linesOf ? lineCosts(base.listing, base.out, linesOf) : selfCosts(base.out, loadMap(base.map));
const after = linesOf ? lineCosts(measured.listing, measured.out, linesOf) : selfCosts(measured.out, loadMap(measured.map));
const per = runs * n * stages;
const rows = [...new Set([...before.keys(), ...after.keys()])]
  .map((name) => [name, ((after.get(name) ?? 0) - (before.get(name) ?? 0)) / per])
  .sort((a, b) => Math.abs(b[1]) - Math.abs(a[1]));
const total = rows.reduce((sum, [, cost]) => sum + cost, 0);
const by = linesOf ? `in optimised \`${linesOf}\`, by line of the bundle` : 'by function (self, with inlined callees)';
console.log(`${which}: ${misses ? 'L1 data misses (simulated)' : 'instructions'} per element per stage, ${by}`);
for (const [name, cost] of rows.slice(0, top)) console.log(`${cost.toFixed(1).padStart(9)}  ${name.slice(0, 100)}`);
console.log(`${total.toFixed(1).padStart(9)}  total`);
