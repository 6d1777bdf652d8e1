// Wall clock, two versions of the code, compared in pairs run side by side: one process of each
// at the same moment, one on each of the two cores, so both see the same state of a noisy host.
// Which one starts first alternates. Prints every pair and the geometric mean of new ÷ old.
//
//     git worktree add /tmp/old <commit> && ln -s "$PWD/node_modules" /tmp/old/node_modules
//     node bench/pair.mjs /tmp/old . async-c16 [pairs=10]
//
// Each run is bench/count.ts with COUNT_TIME=1 (COUNT_N default 500k, COUNT_RUNS default 3).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const [oldTree, newTree, which = 'async-c1', pairsArg = '10'] = process.argv.slice(2);
if (!oldTree || !newTree) {
  console.error('usage: node bench/pair.mjs <old tree> <new tree> [case] [pairs]');
  process.exit(2);
}
const pairs = Number(pairsArg);
const dir = mkdtempSync(join(tmpdir(), 'sluice-pair-'));

function bundle(tree, name) {
  const out = join(dir, `${name}.mjs`);
  const esbuild = resolve('node_modules/.bin/esbuild');
  execFileSync(
    esbuild,
    ['bench/count.ts', '--bundle', '--platform=node', '--format=esm', '--conditions=sluice-source', `--outfile=${out}`, '--log-level=warning'],
    { cwd: tree },
  );
  return out;
}

function run(file) {
  const env = { ...process.env, COUNT_TIME: '1', COUNT_CASE: which, COUNT_N: process.env.COUNT_N ?? '500000', COUNT_RUNS: process.env.COUNT_RUNS ?? '3' };
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, [file], { env, stdio: ['ignore', 'pipe', 'inherit'] });
    let text = '';
    child.stdout.on('data', (d) => (text += d));
    child.on('close', (code) => {
      const ns = /([\d.]+) ns/.exec(text)?.[1];
      if (code !== 0 || ns === undefined) fail(new Error(`${file}: exit ${code}\n${text}`));
      else done(Number(ns));
    });
  });
}

const oldFile = bundle(oldTree, 'old');
const newFile = bundle(newTree, 'new');
let logSum = 0;
for (let i = 0; i < pairs; i++) {
  // Whichever starts first gets a head start of a few milliseconds: they take turns.
  const oldFirst = i % 2 === 0;
  const [a, b] = await Promise.all(oldFirst ? [run(oldFile), run(newFile)] : [run(newFile), run(oldFile)]);
  const [oldNs, newNs] = oldFirst ? [a, b] : [b, a];
  logSum += Math.log(newNs / oldNs);
  console.log(`${which} pair ${i + 1}: old ${oldNs.toFixed(1)} ns, new ${newNs.toFixed(1)} ns, new ÷ old ${(newNs / oldNs).toFixed(3)}`);
}
console.log(`${which}: new ÷ old, geometric mean of ${pairs} pairs: ${Math.exp(logSum / pairs).toFixed(3)}`);
