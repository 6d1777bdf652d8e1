// Exact top-10 cosine search, 100k × 384: VectorIndex (SIMD kernel + bounded heap) against a naive
// loop (every score into an array, then a full sort). Standalone:
//   node --conditions=sluice-source --import tsx bench/vector-index.ts [rows] [dim] [queries]
import { performance } from 'node:perf_hooks';
import { VectorIndex } from '../src/ai/rag/vector-index.js';

const rows = Number(process.argv[2] ?? 100_000);
const dim = Number(process.argv[3] ?? 384);
const queries = Number(process.argv[4] ?? 50);
const k = 10;

// Deterministic data (mulberry32), so runs compare.
let seed = 0x5eed;
const random = (): number => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296 - 0.5;
};

const index = new VectorIndex<null>(dim, { capacity: rows });
const naive = new Float32Array(rows * dim);
const vector = new Float32Array(dim);
let started = performance.now();
for (let r = 0; r < rows; r++) {
  let norm = 0;
  for (let j = 0; j < dim; j++) norm += (vector[j] = random()) ** 2;
  for (let j = 0; j < dim; j++) naive[r * dim + j] = vector[j]! / Math.sqrt(norm);
  index.add(`v${r}`, vector, null);
}
console.log(`built ${rows} × ${dim} in ${(performance.now() - started).toFixed(0)} ms`);
const qs = Array.from({ length: queries }, () => Float32Array.from({ length: dim }, random));

function naiveSearch(query: Float32Array): number[] {
  let norm = 0;
  for (let j = 0; j < dim; j++) norm += query[j]! * query[j]!;
  const scale = 1 / Math.sqrt(norm);
  const scores = new Float32Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let j = 0; j < dim; j++) s += naive[r * dim + j]! * query[j]!;
    scores[r] = s * scale;
  }
  const order = Array.from({ length: rows }, (_, i) => i);
  order.sort((a, b) => scores[b]! - scores[a]!);
  return order.slice(0, k);
}

function time(label: string, run: (q: Float32Array) => unknown): number {
  for (let i = 0; i < 3; i++) run(qs[i % qs.length]!); // warm-up: JIT tiers, page faults
  started = performance.now();
  for (const q of qs) run(q);
  const perQuery = (performance.now() - started) / qs.length;
  console.log(`${label.padEnd(40)} ${perQuery.toFixed(2).padStart(8)} ms/query`);
  return perQuery;
}

const fast = time('VectorIndex.search (SIMD + heap)', (q) => index.search(q, { k }));
const slow = time('naive (scores array + full sort)', naiveSearch);
console.log(`ratio: naive / VectorIndex = ${(slow / fast).toFixed(1)}×`);

let agree = 0;
for (const q of qs) {
  const a = new Set(index.search(q, { k }).map((h) => h.id));
  agree += naiveSearch(q).filter((r) => a.has(`v${r}`)).length;
}
console.log(`same top-${k} ids: ${agree} of ${qs.length * k} (float32 vs float64 summation may swap near-ties)`);
