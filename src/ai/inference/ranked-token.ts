/**
 * The sampled draw (temperature > 0, with top-k and top-p) as a fast path of `sampleToken`: it
 * ranks the scores' values with a radix sort (or keeps only the top k of them) instead of
 * sorting every token id by a comparator, then walks the ids once. The general draw's sums run
 * over the probabilities in rank order, and a value's probability depends on its value alone,
 * so the sorted values give the same sums bit for bit.
 */
import { logSoftmaxAt } from './greedy-token.js';
import { sortDescending } from './radix-sort.js';
import { untruncated, type SampledToken, type SamplingParams } from './sampling-params.js';
import { penalise } from './sampling-penalties.js';

/** Reused across draws: a draw is synchronous, so no two use them at once. */
let scores = new Float64Array(0);
let ranked = new Float64Array(0);
let spare = new Float64Array(0);

/**
 * The sampled token and its log-probability at temperature 1, as the general draw gives them, or
 * `undefined` when a score is NaN (the general draw's order is then its sort's own): the caller
 * falls back to it before any random number is taken.
 *
 * ## Example
 * ```ts
 * rankedToken(Float32Array.from([0, 2, 1]), { temperature: 0.8, top_p: 0.9 }, Math.random, [], 0); // { id: 1, logprob: ... }
 * ```
 */
export function rankedToken(
  logits: ArrayLike<number>,
  params: SamplingParams,
  random: () => number,
  history: readonly number[],
  promptLength: number,
): SampledToken | undefined {
  const n = logits.length;
  if (scores.length !== n) {
    scores = new Float64Array(n);
    ranked = new Float64Array(n);
    spare = new Float64Array(n);
  }
  scores.set(logits);
  penalise(scores, params, history, promptLength);
  if (untruncated(params, n)) return wholeDraw(scores, params.temperature ?? 1, random);
  const topK = params.top_k ?? 0;
  const kept = topK > 0 ? Math.min(topK, n) : n;
  const top = topValues(scores, kept);
  if (top === undefined) return undefined;
  const temperature = params.temperature ?? 1;
  const max = top[0]!;
  let total = 0;
  for (let rank = 0; rank < kept; rank++) total += Math.exp((top[rank]! - max) / temperature);
  const support = supportSize(top, kept, max, temperature, total, params.top_p ?? 1);
  total = 0;
  for (let rank = 0; rank < support; rank++) total += Math.exp((top[rank]! - max) / temperature);
  const id = walk(scores, top[support - 1]!, countAbove(top, support), support, max, temperature, total, random());
  return { id, logprob: logSoftmaxAt(scores, id) };
}

/** The draw over every token, as the general one sums it when nothing is cut: in id order, no ranking. */
function wholeDraw(scores: Float64Array, temperature: number, random: () => number): SampledToken | undefined {
  let max = Number.NEGATIVE_INFINITY;
  for (let id = 0; id < scores.length; id++) {
    const score = scores[id]!;
    if (Number.isNaN(score)) return undefined;
    if (score > max) max = score;
  }
  // Each weight once: the walk divides the same doubles the sum added, as the general draw does.
  const weights = ranked;
  let total = 0;
  for (let id = 0; id < scores.length; id++) total += weights[id] = Math.exp((scores[id]! - max) / temperature);
  let id = -1;
  let r = random();
  for (let i = 0; i < scores.length; i++) {
    const p = weights[i]! / total;
    if (p === 0) continue;
    id = i;
    r -= p;
    if (r < 0) break;
  }
  // At temperature 1 the log-softmax's own sum is this one, term for term.
  return { id, logprob: temperature === 1 ? scores[id]! - max - Math.log(total) : logSoftmaxAt(scores, id) };
}

/** How many ranks top-p keeps: up to the first whose cumulative probability reaches `topP`. */
function supportSize(top: Float64Array, kept: number, max: number, temperature: number, total: number, topP: number): number {
  if (topP >= 1) return kept;
  let cumulative = 0;
  for (let rank = 0; rank < kept; rank++) {
    cumulative += Math.exp((top[rank]! - max) / temperature) / total;
    if (cumulative >= topP) return rank + 1;
  }
  return kept;
}

/** Ranks before `support` whose value is above the last kept one (the rest of the support are ties of it). */
function countAbove(top: Float64Array, support: number): number {
  const last = top[support - 1]!;
  let above = 0;
  while (above < support && top[above]! > last) above++;
  return above;
}

/**
 * The draw over the support in id order. The support is every id above `last` and, of the ids equal
 * to it, the lowest ones: the general order breaks ties by id.
 */
function walk(values: Float64Array, last: number, above: number, support: number, max: number, temperature: number, total: number, draw: number): number {
  let ties = support - above;
  let id = -1;
  let r = draw;
  for (let i = 0; i < values.length; i++) {
    const value = values[i]!;
    if (value < last || (value === last && ties-- <= 0)) continue;
    const p = Math.exp((value - max) / temperature) / total;
    if (p === 0) continue;
    id = i;
    r -= p;
    if (r < 0) break;
  }
  return id;
}

/** The `kept` largest of `values`, largest first; `undefined` when one is NaN. */
function topValues(values: Float64Array, kept: number): Float64Array | undefined {
  for (let i = 0; i < values.length; i++) if (Number.isNaN(values[i]!)) return undefined;
  // A few of many: a min-heap of the kept ones beats sorting them all.
  if (kept * 8 < values.length) return largestByHeap(values, kept);
  ranked.set(values);
  return sortDescending(ranked, spare);
}

/** The `kept` largest values, largest first, through a min-heap of `kept` entries. */
function largestByHeap(values: Float64Array, kept: number): Float64Array {
  const heap = ranked.subarray(0, kept);
  heap.set(values.subarray(0, kept));
  heap.sort();
  // A sorted array is a min-heap: each later value replaces the root when larger, then sifts down.
  for (let i = kept; i < values.length; i++) {
    const value = values[i]!;
    if (value <= heap[0]!) continue;
    let at = 0;
    for (;;) {
      const left = 2 * at + 1;
      if (left >= kept) break;
      const child = left + 1 < kept && heap[left + 1]! < heap[left]! ? left + 1 : left;
      if (heap[child]! >= value) break;
      heap[at] = heap[child]!;
      at = child;
    }
    heap[at] = value;
  }
  heap.sort();
  heap.reverse();
  return heap;
}
