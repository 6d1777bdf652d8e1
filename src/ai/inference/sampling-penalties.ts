/**
 * The penalties that shape logits before a token is drawn: CTRL's repetition penalty over the
 * whole history, OpenAI's presence and frequency penalties over the generated part.
 */
import type { SamplingParams } from './sampling-params.js';

/**
 * CTRL-style repetition penalty, in place: a logit of a token in `history` is divided
 * by `penalty` when positive and multiplied when negative, so `penalty > 1` always
 * makes it less likely (dividing a negative logit would raise it).
 *
 * ## Example
 * ```ts
 * const logits = Float64Array.from([2, -1, 0.5]);
 * applyRepetitionPenalty(logits, [0, 1], 2); // [1, -2, 0.5]
 * ```
 */
export function applyRepetitionPenalty(logits: Float64Array, history: Iterable<number>, penalty: number): void {
  if (penalty === 1) return;
  const seen = new Set<number>();
  for (const id of history) {
    if (seen.has(id) || id < 0 || id >= logits.length) continue;
    seen.add(id);
    const logit = logits[id]!;
    logits[id] = logit > 0 ? logit / penalty : logit * penalty;
  }
}

/**
 * OpenAI's presence and frequency penalties, in place: each token generated so far loses
 * `presence` once and `frequency` per time it occurs (`generated` is the generated ids only).
 *
 * ## Example
 * ```ts
 * const logits = Float64Array.from([2, 1, 0]);
 * applyOccurrencePenalties(logits, [0, 0, 1], 0.5, 0.25); // [1, 0.25, 0]
 * ```
 */
export function applyOccurrencePenalties(logits: Float64Array, generated: readonly number[], presence: number, frequency: number): void {
  if (presence === 0 && frequency === 0) return;
  const counts = new Map<number, number>();
  for (const id of generated) if (id >= 0 && id < logits.length) counts.set(id, (counts.get(id) ?? 0) + 1);
  for (const [id, count] of counts) logits[id] = logits[id]! - presence - frequency * count;
}

/** @internal Whether `params` changes any logit (else the logits can be read as they are). */
export function hasPenalties(params: SamplingParams): boolean {
  return (params.repetition_penalty ?? 1) !== 1 || (params.presence_penalty ?? 0) !== 0 || (params.frequency_penalty ?? 0) !== 0;
}

/** @internal Every penalty of `params` on `scores`, in place: the history's first `promptLength` ids are the prompt. */
export function penalise(scores: Float64Array, params: SamplingParams, history: readonly number[], promptLength: number): void {
  applyRepetitionPenalty(scores, history, params.repetition_penalty ?? 1);
  const presence = params.presence_penalty ?? 0;
  const frequency = params.frequency_penalty ?? 0;
  if (presence !== 0 || frequency !== 0) applyOccurrencePenalties(scores, history.slice(promptLength), presence, frequency);
}
