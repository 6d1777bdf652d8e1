/**
 * Choosing the next token from a model's logits: repetition penalty, temperature,
 * top-k, top-p, a seedable generator; and stop sequences over streamed text.
 *
 * The order is the Hugging Face one: penalties on the raw logits (repetition over the whole
 * history; OpenAI's presence and frequency over the generated part), then temperature, then
 * top-k, then top-p over what is left, then one draw.
 */
import { argmax, greedyToken, isGreedy, logSoftmaxAt } from './greedy-token.js';
import { rankedToken } from './ranked-token.js';
import { untruncated, type SampledToken, type SamplingParams } from './sampling-params.js';
import { penalise } from './sampling-penalties.js';

export { applyOccurrencePenalties, applyRepetitionPenalty } from './sampling-penalties.js';
export type { SampledToken, SamplingParams } from './sampling-params.js';

/**
 * The distribution a token is drawn from: probabilities summing to 1, zero outside the
 * support that top-k and top-p leave. Temperature 0 (or `top_k: 1`) puts all the mass
 * on the most likely token (the first one on a tie).
 *
 * ## Example
 * ```ts
 * distribution(Float32Array.from([3, 2, 1, 0]), { top_k: 2 }); // two non-zero entries, at 0 and 1
 * ```
 */
export function distribution(logits: ArrayLike<number>, params: SamplingParams = {}, history: Iterable<number> = [], promptLength = 0): Float64Array {
  const scores = Float64Array.from(logits as ArrayLike<number>);
  penalise(scores, params, Array.isArray(history) ? (history as number[]) : [...history], promptLength);
  const probabilities = new Float64Array(scores.length);
  const temperature = params.temperature ?? 1;
  const topK = params.top_k ?? 0;
  if (temperature === 0 || topK === 1) {
    probabilities[argmax(scores)] = 1;
    return probabilities;
  }
  if (untruncated(params, scores.length) && !scores.some(Number.isNaN)) return wholeDistribution(scores, temperature, probabilities);
  // Sorted once: top-k and top-p both walk the tokens from the most likely down.
  const order = Array.from(scores.keys()).sort((a, b) => scores[b]! - scores[a]! || a - b);
  const kept = topK > 0 ? Math.min(topK, order.length) : order.length;
  const max = scores[order[0]!]!;
  let total = 0;
  for (let rank = 0; rank < kept; rank++) {
    const id = order[rank]!;
    const p = Math.exp((scores[id]! - max) / temperature);
    probabilities[id] = p;
    total += p;
  }
  const topP = params.top_p ?? 1;
  let cumulative = 0;
  let support = kept;
  if (topP < 1) {
    for (let rank = 0; rank < kept; rank++) {
      cumulative += probabilities[order[rank]!]! / total;
      if (cumulative >= topP) {
        support = rank + 1;
        break;
      }
    }
    for (let rank = support; rank < kept; rank++) probabilities[order[rank]!] = 0;
  }
  total = 0;
  for (let rank = 0; rank < support; rank++) total += probabilities[order[rank]!]!;
  for (let rank = 0; rank < support; rank++) probabilities[order[rank]!]! /= total;
  return probabilities;
}

/** Every token's probability, summed in id order (no ranking needed when nothing is cut). */
function wholeDistribution(scores: Float64Array, temperature: number, probabilities: Float64Array): Float64Array {
  let max = Number.NEGATIVE_INFINITY;
  for (let id = 0; id < scores.length; id++) if (scores[id]! > max) max = scores[id]!;
  let total = 0;
  for (let id = 0; id < scores.length; id++) total += probabilities[id] = Math.exp((scores[id]! - max) / temperature);
  for (let id = 0; id < scores.length; id++) probabilities[id]! /= total;
  return probabilities;
}

/**
 * Draws one token from `logits` shaped by `params`. `history` is the ids so far, the prompt's
 * first (`promptLength` of them): presence and frequency penalties count only what follows.
 *
 * ## Example
 * ```ts
 * const random = seededRandom(42);
 * const { id, logprob } = sampleToken(logits, { temperature: 0.8, top_p: 0.95 }, random, previousIds);
 * ```
 */
export function sampleToken(
  logits: ArrayLike<number>,
  params: SamplingParams,
  random: () => number,
  history: Iterable<number> = [],
  promptLength = 0,
): SampledToken {
  const historyIds = Array.isArray(history) ? (history as number[]) : [...history];
  if (isGreedy(params)) return greedyToken(logits, params, random, historyIds, promptLength);
  return rankedToken(logits, params, random, historyIds, promptLength) ?? drawFromDistribution(logits, params, random, historyIds, promptLength);
}

/** @internal The general draw: builds the whole distribution, then walks it by id; every fast path gives its token. */
export function drawFromDistribution(
  logits: ArrayLike<number>,
  params: SamplingParams,
  random: () => number,
  history: readonly number[],
  promptLength: number,
): SampledToken {
  const probabilities = distribution(logits, params, history, promptLength);
  let id = -1;
  let r = random();
  for (let i = 0; i < probabilities.length; i++) {
    const p = probabilities[i]!;
    if (p === 0) continue;
    id = i;
    r -= p;
    if (r < 0) break;
  }
  const scores = Float64Array.from(logits);
  penalise(scores, params, history, promptLength);
  return { id, logprob: logSoftmaxAt(scores, id) };
}

/**
 * Finds stop sequences in text that arrives in pieces. Text that could be the start of
 * a stop sequence is held back until the next piece shows whether it is; text before a
 * stop sequence is released, the stop sequence itself never is. When several stop
 * sequences occur, the one that begins first wins, even if a shorter one completes
 * sooner (`['bca', 'c']` on `'bc'` then `'a'` stops before the `b`).
 *
 * ## Example
 * ```ts
 * const stops = new StopMatcher(['END']);
 * stops.push('abc E'); // { text: 'abc ', stopped: false } ('E' is held)
 * stops.push('ND!');   // { text: '', stopped: true }
 * ```
 */
export class StopMatcher {
  private held = '';
  private readonly longest: number;
  private found = false;

  constructor(private readonly stops: readonly string[]) {
    this.longest = Math.max(0, ...stops.map((s) => s.length));
  }

  /** Whether a stop sequence was found (by `push`, or by `flush` in what was still held). */
  get matched(): boolean {
    return this.found;
  }

  /** The text safe to emit now, and whether a stop sequence was found (then nothing is held any more). */
  push(piece: string): { text: string; stopped: boolean } {
    const text = this.held + piece;
    const at = this.firstMatch(text);
    // Where a stop sequence may still begin: the start of the longest suffix that is a proper prefix of one.
    const keep = this.heldSuffix(text);
    const pending = keep > 0 ? text.length - keep : -1;
    if (at >= 0 && (pending < 0 || pending >= at)) {
      this.held = '';
      this.found = true;
      return { text: text.slice(0, at), stopped: true };
    }
    // Invariant: a stop sequence beginning in the released text would lie wholly inside `text` (none
    // does before `at`) or run past its end (its start would be a pending one, and none is earlier).
    const release = pending >= 0 ? pending : text.length;
    this.held = text.slice(release);
    return { text: text.slice(0, release), stopped: false };
  }

  /** The text still held back when the generation ends: up to a stop sequence it holds, if any. */
  flush(): string {
    const held = this.held;
    this.held = '';
    const at = this.firstMatch(held);
    if (at < 0) return held;
    this.found = true;
    return held.slice(0, at);
  }

  private firstMatch(text: string): number {
    let at = -1;
    for (const stop of this.stops) {
      const i = text.indexOf(stop);
      if (i >= 0 && (at < 0 || i < at)) at = i;
    }
    return at;
  }

  /** Length of the longest suffix of `text` that is a proper prefix of some stop sequence. */
  private heldSuffix(text: string): number {
    for (let length = Math.min(this.longest - 1, text.length); length > 0; length--) {
      const suffix = text.slice(text.length - length);
      if (this.stops.some((stop) => stop.length > length && stop.startsWith(suffix))) return length;
    }
    return 0;
  }
}
