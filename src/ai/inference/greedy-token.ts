/**
 * The greedy draw (temperature 0 or `top_k: 1`) as a fast path of `sampleToken`: one argmax over
 * the penalised logits, read in place when no penalty applies, with no distribution built.
 */
import { hasPenalties, penalise } from './sampling-penalties.js';
import type { SampledToken, SamplingParams } from './sampling-params.js';

/** Reused across draws: a draw is synchronous, so no two use it at once. */
let scratch = new Float64Array(0);

/** Whether `params` puts all the mass on the most likely token, so `greedyToken` gives `sampleToken`'s draw. */
export function isGreedy(params: SamplingParams): boolean {
  return (params.temperature ?? 1) === 0 || (params.top_k ?? 0) === 1;
}

/**
 * The most likely token after the penalties (the first one on a tie) and its log-probability at
 * temperature 1: the same token and figure as the general draw, which consumes one `random()`.
 *
 * ## Example
 * ```ts
 * greedyToken(Float32Array.from([0, 2, 1]), { temperature: 0 }, Math.random, []); // { id: 1, logprob: ... }
 * ```
 */
export function greedyToken(
  logits: ArrayLike<number>,
  params: SamplingParams,
  random: () => number,
  history: readonly number[],
  promptLength: number,
): SampledToken {
  // The general draw takes one number even when the mass is on one token: the seeded sequence stays aligned.
  random();
  const scores = hasPenalties(params) ? penalisedCopy(logits, params, history, promptLength) : logits;
  const id = argmax(scores);
  return { id, logprob: logSoftmaxBelow(scores, id, scores[id]!) };
}

function penalisedCopy(logits: ArrayLike<number>, params: SamplingParams, history: readonly number[], promptLength: number): Float64Array {
  if (scratch.length !== logits.length) scratch = new Float64Array(logits.length);
  scratch.set(logits);
  penalise(scratch, params, history, promptLength);
  return scratch;
}

/** @internal The index of the largest value, the first on a tie. */
export function argmax(values: ArrayLike<number>): number {
  let best = 0;
  let largest = values[0]!;
  for (let i = 1; i < values.length; i++) {
    const value = values[i]!;
    if (value > largest) {
      best = i;
      largest = value;
    }
  }
  return best;
}

/** @internal The natural log of the softmax of `scores` at `id`. */
export function logSoftmaxAt(scores: ArrayLike<number>, id: number): number {
  return logSoftmaxBelow(scores, id, scores[argmax(scores)]!);
}

/** The same, given the largest score `max` (the greedy draw has it already). */
function logSoftmaxBelow(scores: ArrayLike<number>, id: number, max: number): number {
  let total = 0;
  for (let i = 0; i < scores.length; i++) total += Math.exp(scores[i]! - max);
  return scores[id]! - max - Math.log(total);
}
