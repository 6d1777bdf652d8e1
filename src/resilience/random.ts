/**
 * Seedable randomness and backoff arithmetic. Jitter and traffic splits take a
 * `random: () => number` in [0, 1) so tests can pin them; `seededRandom` gives a
 * reproducible one.
 */

/** A reproducible generator of numbers in [0, 1) (mulberry32): the same seed gives the same sequence. */
export { seededRandom } from '../core/random.js';

/** Exponential backoff: the base delay, the cap and the jitter. */
export interface BackoffOptions {
  /** Delay before the first retry (ms). */
  readonly baseDelay: number;
  /** No delay exceeds this (ms). */
  readonly maxDelay: number;
  /** Share of each delay that is randomised: 0 none, 1 "full jitter" (anywhere in [0, delay]). */
  readonly jitter: number;
}

/**
 * Delay before retry `retry` (1-based): `min(maxDelay, baseDelay × 2^(retry-1))`,
 * of which a `jitter` share is taken away at random, so clients that failed together
 * do not retry together: `delay × (1 − jitter × random())`, rounded to whole ms.
 */
export function backoffDelay(retry: number, options: BackoffOptions, random: () => number): number {
  const exponential = Math.min(options.maxDelay, options.baseDelay * 2 ** (retry - 1));
  if (options.jitter === 0) return exponential; // leaves the random sequence untouched
  return Math.round(exponential * (1 - options.jitter * random()));
}
