import { lazySchema } from '../core/zod.js';
import { asyncScheduler, type SchedulerLike } from 'rxjs';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../flow/options.js';
import { attemptChain } from './chain.js';
import { backoffDelay } from './random.js';
import type { StreamWork } from './relay.js';
import type { Work } from '../flow/work.js';

/** Options of `retrying`: how many attempts, the backoff between them, and which errors are retried. */
export interface RetryOptions {
  /** Attempts in all, the first included (3 = up to 2 retries). */
  attempts: number;
  /** Delay before the first retry (ms); doubles with every retry. */
  baseDelay: number;
  /** No delay exceeds this (ms). Default: no cap. */
  maxDelay?: number;
  /** Share of each delay taken away at random: 0 none (default), 1 "full jitter". */
  jitter?: number;
  /** Whether a failure is worth another attempt (`retry` is 1-based). Default: every failure. */
  retryOn?: (error: unknown, retry: number) => boolean;
  /** Numbers in [0, 1) for the jitter. Default `Math.random`; pass `seededRandom(seed)` for reproducible delays. */
  random?: () => number;
  /**
   * The longest server-requested wait honoured (ms, default 60 000): a failure whose
   * `retryAfter` is longer is not retried and propagates at once, unchanged.
   */
  maxRetryAfter?: number;
  /** Timers of the backoff. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
}

const retryOptionsSchema = lazySchema((z) =>
  z
    .object({
      attempts: positiveInt('attempts'),
      baseDelay: z.number({ error: 'baseDelay must be a number of ms' }).min(0, { error: 'baseDelay must be ≥ 0 ms' }),
      maxDelay: z.number({ error: 'maxDelay must be a number of ms' }).min(0, { error: 'maxDelay must be ≥ 0 ms' }).default(Infinity),
      jitter: z
        .number({ error: 'jitter must be a number' })
        .min(0, { error: 'jitter must be in [0, 1]' })
        .max(1, { error: 'jitter must be in [0, 1]' })
        .default(0),
      retryOn: functionSchema<(error: unknown, retry: number) => boolean>().optional(),
      random: functionSchema<() => number>().default(() => Math.random),
      maxRetryAfter: z.number({ error: 'maxRetryAfter must be a number of ms' }).min(0, { error: 'maxRetryAfter must be ≥ 0 ms' }).default(60_000),
      scheduler: schedulerSchema().optional(),
    })
    .strict(),
);

/**
 * Wraps a work function so a failure is retried with exponential backoff and jitter
 * — but **only before its first output went downstream**. Once a token has been
 * emitted, a failure ends the stream: another attempt would send its tokens again
 * (or splice two different answers together), so the output is always one attempt's
 * tokens, complete or cut short by an error, never a repeat.
 *
 * ```
 * attempt 1:  --#                     (fails before any token)
 * attempt 2:          --a-b-c|        (after baseDelay × 2^0, less jitter)
 * retrying(work, { attempts: 3, baseDelay: 6 })
 * output:     ----------a-b-c|
 *
 * attempt 1:  --a-#                   (fails after a token)
 * output:     --a-#                   (no retry: the failure propagates)
 * ```
 *
 * Delay before retry `r`: `min(maxDelay, baseDelay × 2^(r−1)) × (1 − jitter × random())`.
 *
 * **Retry-After.** A failure that carries a numeric `retryAfter` ≥ 0 in ms
 * (`RateLimitedError` from an HTTP 429, `CircuitOpenError`, `AdmissionRejectedError`,
 * or any error of yours with that property) is retried no sooner than the server
 * asked: the delay is `max(backoff, retryAfter)`, with neither jitter nor `maxDelay`
 * applied to `retryAfter`. A `retryAfter` over `maxRetryAfter` (default 60 s) is not
 * waited out: that failure propagates at once, unchanged, so a caller is never held
 * for minutes by one answer. `retryOn` and `attempts` still decide first. The wait
 * asked for is noted in the trace (`trace.notes["<stage>.retryAfter"]`).
 *
 * ```
 * attempt 1:  -#                      (RateLimitedError, retryAfter: 30)
 * attempt 2:                                 -a|
 * retrying(work, { attempts: 2, baseDelay: 10 })
 * output:     --------------------------------a|   (waits 30, not 10)
 * ```
 *
 * Each attempt gets its own `AbortSignal` (fired when it is abandoned; the caller's
 * signal fires it too), and no attempt starts after the caller's signal fired. The
 * number of retries is noted in the element's trace (`trace.notes["<stage>.retries"]`).
 * When every attempt failed, the last failure propagates unchanged.
 *
 * ## Example
 * ```ts
 * const generate = retrying(withTimeouts(callModel, { idle: 2_000 }), {
 *   attempts: 3, baseDelay: 200, maxDelay: 2_000, jitter: 1,
 *   retryOn: (err) => !(err instanceof CircuitOpenError),
 * });
 * prompts.pipe(stage(generate, { name: 'infer' }));
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see withTimeouts, fallback, `seededRandom`.
 */
export function retrying<I, O>(work: Work<I, O>, options: RetryOptions): StreamWork<I, O> {
  const parsed = parseOptions(retryOptionsSchema(), options, 'retrying options');
  const scheduler = parsed.scheduler ?? asyncScheduler;
  const { attempts, retryOn, random, maxRetryAfter } = parsed;
  return (value, context) =>
    attemptChain<O>(
      {
        run: (_, attemptContext) => work(value, attemptContext),
        next: (n, error) => {
          const retry = n + 1;
          if (retry >= attempts || (retryOn !== undefined && !retryOn(error, retry))) return undefined;
          const asked = retryAfterOf(error);
          if (asked !== undefined) context.note('retryAfter', asked);
          if (asked !== undefined && asked > maxRetryAfter) return undefined;
          context.note('retries', retry);
          return Math.max(backoffDelay(retry, parsed, random), asked ?? 0);
        },
      },
      context,
      scheduler,
    );
}

/**
 * The wait (ms) a failure asks for before a retry: its `retryAfter` property when that
 * is a finite number ≥ 0 (`RateLimitedError`, `CircuitOpenError`, `AdmissionRejectedError`,
 * or any error shaped alike), else `undefined`.
 */
export function retryAfterOf(error: unknown): number | undefined {
  if (typeof error !== 'object' || error === null || !('retryAfter' in error)) return undefined;
  const { retryAfter } = error;
  return typeof retryAfter === 'number' && Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter : undefined;
}
