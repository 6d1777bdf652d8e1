import { lazySchema } from '../core/zod.js';
import { asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import { parseOptions, schedulerSchema } from '../flow/options.js';
import { AbortedError } from '../core/errors.js';
import { StreamTimeoutError, type StreamTimeoutKind } from './errors.js';
import { AttemptContext, Relay, type StreamWork } from './relay.js';
import type { StageContext, Work } from '../flow/work.js';

/** Options of `withTimeouts`: how long a stream may take in all and between two elements. */
export interface TimeoutOptions {
  /** The whole stream must complete within this (ms), from subscription. */
  total?: number;
  /** At most this long (ms) before the first output and between two outputs. */
  idle?: number;
  /** Timers. Default `asyncScheduler`; a `TestScheduler` for virtual time. */
  scheduler?: SchedulerLike;
}

const timeoutOptionsSchema = lazySchema((z) =>
  z
    .object({
      total: z.number({ error: 'total must be a number of ms' }).positive({ error: 'total must be > 0 ms' }).optional(),
      idle: z.number({ error: 'idle must be a number of ms' }).positive({ error: 'idle must be > 0 ms' }).optional(),
      scheduler: schedulerSchema().optional(),
    })
    .strict()
    .refine((o) => o.total !== undefined || o.idle !== undefined, { error: 'give total, idle, or both', path: ['total'] }),
);

/**
 * Wraps a work function that returns a token stream with two deadlines: `total`
 * for the whole stream and `idle` for the silence before the first token and
 * between tokens (a stalled model server stops streaming long before a total
 * deadline would notice). When one passes, the work's `AbortSignal` fires (the
 * request to the model is cancelled) and the stream errors with
 * `StreamTimeoutError` (`kind: 'total' | 'idle'`, code `STREAM_TIMEOUT`).
 *
 * ```
 * tokens:    -a-b------c|
 * withTimeouts(work, { idle: 4 })
 * output:    -a-b----#              StreamTimeoutError { kind: 'idle', timeout: 4 }
 *
 * tokens:    -a-b-c-d-e|
 * withTimeouts(work, { total: 6 })
 * output:    -a-b-c#                StreamTimeoutError { kind: 'total', timeout: 6 }
 * ```
 *
 * Time a token waits for downstream demand is not silence: the idle clock stops
 * while the consumer has no room and restarts when it asks again. The total clock
 * never stops. Unlike the stage's `timeout` (which fails the element with
 * `StageTimeoutError`), the error here is the work's, so `retrying` and `fallback`
 * can act on it.
 *
 * ## Example
 * ```ts
 * const generate = withTimeouts((prompt, { signal }) => model.stream(prompt, { signal }), { total: 30_000, idle: 2_000 });
 * prompts.pipe(stage(generate, { name: 'infer' }));
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see retrying, fallback.
 */
export function withTimeouts<I, O>(work: Work<I, O>, options: TimeoutOptions): StreamWork<I, O> {
  const parsed = parseOptions(timeoutOptionsSchema(), options, 'withTimeouts options');
  const scheduler = parsed.scheduler ?? asyncScheduler;
  return (value, context) => new Flow<O>((outlet) => new TimeoutRun(work, value, context, parsed.total, parsed.idle, scheduler, outlet));
}

class TimeoutRun<I, O> implements Producer {
  private readonly attempt: AttemptContext;
  private readonly relay: Relay<O>;
  private totalTimer: Subscription | undefined;
  private idleTimer: Subscription | undefined;
  private ended = false;

  constructor(
    private readonly work: Work<I, O>,
    private readonly value: I,
    private readonly context: StageContext,
    private readonly total: number | undefined,
    private readonly idle: number | undefined,
    private readonly scheduler: SchedulerLike,
    private readonly outlet: Outlet<O>,
  ) {
    this.attempt = new AttemptContext(context);
    this.relay = new Relay<O>(() => outlet.wants(), scheduler, {
      output: (output) => {
        this.outlet.next(output);
        if (this.ended) return;
        if (this.outlet.wants()) this.armIdle();
        else this.stopIdle();
      },
      error: (err) => this.end(() => this.outlet.error(err)),
      complete: () => this.end(() => this.outlet.complete()),
    });
  }

  start(): void {
    if (this.total !== undefined) this.totalTimer = this.scheduler.schedule(() => this.expire('total', this.total!), this.total);
    this.armIdle();
    this.relay.start(() => this.work(this.value, this.attempt));
  }

  pull(): void {
    if (this.ended) return;
    // pull() also comes right after start(), demand or not: only demand restarts the idle clock.
    if (this.idleTimer === undefined && this.outlet.wants()) this.armIdle();
    this.relay.resume();
  }

  cancel(): void {
    if (this.ended) return;
    this.end(() => this.attempt.abort(new AbortedError(this.context.stage, 'the consumer cancelled')));
  }

  private armIdle(): void {
    if (this.idle === undefined) return;
    this.stopIdle();
    this.idleTimer = this.scheduler.schedule(() => this.expire('idle', this.idle!), this.idle);
  }

  private stopIdle(): void {
    this.idleTimer?.unsubscribe();
    this.idleTimer = undefined;
  }

  private expire(kind: StreamTimeoutKind, timeout: number): void {
    if (this.ended) return;
    const error = new StreamTimeoutError(kind, timeout, this.context.stage);
    this.end(() => {
      this.attempt.abort(error);
      this.outlet.error(error);
    });
  }

  private end(signal: () => void): void {
    this.ended = true;
    this.totalTimer?.unsubscribe();
    this.totalTimer = undefined;
    this.stopIdle();
    this.relay.close();
    this.attempt.release();
    signal();
  }
}
