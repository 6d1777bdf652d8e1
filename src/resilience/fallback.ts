import { lazySchema } from '../core/zod.js';
import { asyncScheduler, type SchedulerLike } from 'rxjs';
import { functionSchema, parseOptions, schedulerSchema } from '../flow/options.js';
import { attemptChain } from './chain.js';
import { FallbackExhaustedError } from './errors.js';
import { named, type StreamWork, type Worker } from './relay.js';
import type { Work } from '../flow/work.js';

/** Options of `fallback`: which errors move on to the next worker. */
export interface FallbackOptions {
  /** Whether a failure of `worker` should move on to the next worker. Default: every failure. */
  when?: (error: unknown, worker: string) => boolean;
  /** Timers of the demand link. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
}

/** @internal */
export const workerSchema = lazySchema((z) =>
  z.union(
    [
      functionSchema<Work<unknown, unknown>>(),
      z.object({ name: z.string().min(1, { error: 'name must not be empty' }), work: functionSchema<Work<unknown, unknown>>() }),
    ],
    { error: 'must be a work function or { name, work }' },
  ),
);

const fallbackSchema = lazySchema((z) =>
  z
    .object({
      workers: z.array(workerSchema()).min(1, { error: 'give at least one worker' }),
      options: z
        .object({
          when: functionSchema<(error: unknown, worker: string) => boolean>().optional(),
          scheduler: schedulerSchema().optional(),
        })
        .strict()
        .default({}),
    })
    .strict(),
);

/**
 * Tries model workers in order: when one fails **before its first output**, the next
 * one gets the same input; once a worker has emitted a token, its failure ends the
 * stream (switching then would splice two answers). The worker that answered is
 * noted in the element's trace (`trace.notes["<stage>.worker"]`).
 *
 * ```
 * primary:    --#                   (fails before any token)
 * secondary:    -a-b|
 * fallback([primary, secondary])
 * output:     ---a-b|               notes: { "infer.worker": "secondary" }
 *
 * primary:    --a-#                 (fails after a token)
 * output:     --a-#                 (no fallback: the failure propagates)
 * ```
 *
 * Workers are work functions (named after the function) or `{ name, work }`. When
 * every worker failed, the stream fails with `FallbackExhaustedError` (code
 * `FALLBACK_EXHAUSTED`) listing each worker's failure; when `when` declines a failure,
 * that failure propagates as it is. Each worker gets its own `AbortSignal`, also fired
 * by the caller's; no worker starts after the caller's signal fired.
 *
 * ## Example
 * ```ts
 * const generate = fallback(
 *   [{ name: 'gpu', work: breaker.wrap(callGpu) }, { name: 'cpu', work: withTimeouts(callCpu, { idle: 5_000 }) }],
 *   { when: (err) => !(err instanceof InputRejectedError) },
 * );
 * prompts.pipe(stage(generate, { name: 'infer' }));
 * ```
 *
 * Invalid arguments throw `InvalidOptionsError` naming each bad field.
 *
 * @see retrying, CircuitBreaker.
 */
export function fallback<I, O>(workers: readonly Worker<I, O>[], options: FallbackOptions = {}): StreamWork<I, O> {
  const parsed = parseOptions(fallbackSchema(), { workers, options }, 'fallback arguments');
  const chain = workers.map((worker, index) => named(worker, index));
  const when = parsed.options.when;
  const scheduler = parsed.options.scheduler ?? asyncScheduler;
  return (value, context) => {
    const failures: { worker: string; error: unknown }[] = [];
    let declined = false;
    return attemptChain<O>(
      {
        run: (n, attemptContext) => chain[n]!.work(value, attemptContext),
        next: (n, error) => {
          failures.push({ worker: chain[n]!.name, error });
          if (n + 1 >= chain.length) return undefined;
          if (when !== undefined && !when(error, chain[n]!.name)) {
            declined = true;
            return undefined;
          }
          return 0;
        },
        answered: (n) => context.note('worker', chain[n]!.name),
        exhausted: (_, error) => (declined ? error : new FallbackExhaustedError(context.stage, failures)),
      },
      context,
      scheduler,
    );
  };
}
