import type * as z from 'zod';
import { lazySchema } from '../core/zod.js';
import { BehaviorSubject, asyncScheduler, distinctUntilChanged, type Observable, type SchedulerLike, type Subscription } from 'rxjs';
import { AbortedError } from '../core/errors.js';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../flow/options.js';
import type { StageContext, Work } from '../flow/work.js';
import { CircuitOpenError } from './errors.js';
import { AttemptContext, Relay, type StreamWork } from './relay.js';

/** `closed`: calls go through. `open`: calls fail at once. `half-open`: a few probe calls test the worker. */
export type CircuitState = 'closed' | 'open' | 'half-open';

/** A state change, for metrics and logs. `at` is the scheduler's clock (ms). */
export interface CircuitStateChange {
  readonly breaker: string;
  readonly from: CircuitState;
  readonly to: CircuitState;
  readonly at: number;
}

/** Options of `CircuitBreaker`: how many failures in a window open it, how long it cools down and how many probes close it. */
export interface CircuitBreakerOptions {
  /** Names the breaker in errors and state changes. Default `breaker-N`. */
  name?: string;
  /** Failures within `window` that open the circuit. */
  failureThreshold: number;
  /** The span (ms) the failures must fall in: failures older than this no longer count. */
  window: number;
  /** How long (ms) the circuit stays open before it lets probes through. */
  cooldown: number;
  /** Probe calls let through at once while half-open. Default 1. */
  probes?: number;
  /** Successful probes that close the circuit again. Default 1. */
  successThreshold?: number;
  /** Whether an error counts against the worker. Default: every error (a cancelled call counts as nothing). */
  isFailure?: (error: unknown) => boolean;
  /** Timers (the cooldown) and the clock. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
  /** Called on every change of state (closed, open, half-open). */
  onStateChange?: (change: CircuitStateChange) => void;
}

const breakerOptionsSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      failureThreshold: positiveInt('failureThreshold'),
      window: z.number({ error: 'window must be a number of ms' }).positive({ error: 'window must be > 0 ms' }),
      cooldown: z.number({ error: 'cooldown must be a number of ms' }).positive({ error: 'cooldown must be > 0 ms' }),
      probes: positiveInt('probes').default(1),
      successThreshold: positiveInt('successThreshold').default(1),
      isFailure: functionSchema<(error: unknown) => boolean>().optional(),
      scheduler: schedulerSchema().optional(),
      onStateChange: functionSchema<(change: CircuitStateChange) => void>().optional(),
    })
    .strict(),
);

/** What a breaker counted since it was made, for metrics and alerts. */
export interface CircuitCounts {
  /** Failures it counted (those `isFailure` judged the worker's), while closed or half-open. */
  readonly failures: number;
  /** Times it opened. */
  readonly opens: number;
  /** Calls it refused while open, or half-open with every probe slot taken. */
  readonly rejected: number;
}

/** Leave to make one call; settle it exactly once. A permit from a state that has since changed counts for nothing. */
export interface CircuitPermit {
  /** Reports the call a success (it may close the circuit). */
  success(): void;
  /** Reports the call a failure (it counts towards opening the circuit). */
  failure(error: unknown): void;
  /** The call was abandoned (cancelled): frees a probe slot, counts as neither. */
  release(): void;
}

let unnamed = 0;

/**
 * A circuit breaker with hysteresis. **Closed**: calls go through; when the last
 * `failureThreshold` failures all fall within `window` ms, it **opens**: calls fail at
 * once with `CircuitOpenError` (carrying `retryAfter`, the ms left of the cooldown).
 * After `cooldown` ms it is **half-open**: up to `probes` calls at a time go through;
 * one failure opens it again for a whole cooldown, `successThreshold` successes close
 * it (and forget past failures).
 *
 * ```
 * calls:    -F-F-F--x----x-----S-S-          F failure, S success, x rejected
 * CircuitBreaker({ failureThreshold: 3, window: 10, cooldown: 8, successThreshold: 2 })
 * state$:   c----o--------h------c           c closed, o open, h half-open
 * ```
 *
 * Wrap a work function with `breaker.wrap(work)` (or `withCircuitBreaker(work,
 * breaker)`); share one breaker across the stages calling the same worker. State is
 * observable for metrics: `state$` (current state first, then changes) and
 * `onStateChange`.
 *
 * A call succeeds when its stream completes and fails when it errors, whatever it
 * emitted before; a cancelled call counts as neither.
 *
 * ## Example
 * ```ts
 * const breaker = new CircuitBreaker({ name: 'gpu-a', failureThreshold: 5, window: 10_000, cooldown: 30_000 });
 * breaker.state$.subscribe((state) => gauge.set({ breaker: 'gpu-a' }, state === 'closed' ? 0 : 1));
 * prompts.pipe(stage(fallback([{ name: 'gpu-a', work: breaker.wrap(callA) }, { name: 'cpu', work: callB }])));
 * ```
 */
export class CircuitBreaker {
  readonly name: string;
  private readonly options: z.output<ReturnType<typeof breakerOptionsSchema>>;
  private readonly scheduler: SchedulerLike;
  private readonly subject: BehaviorSubject<CircuitState>;
  /** Times of the latest failures while closed, oldest first, at most `failureThreshold`. */
  private failures: number[] = [];
  private openedAt = 0;
  private probesInFlight = 0;
  private successes = 0;
  /** Bumped on every transition: permits from an earlier state count for nothing. */
  private epoch = 0;
  private cooldownTimer: Subscription | undefined;
  /** `close` was called: no more timers; an open circuit half-opens when next asked after its cooldown. */
  private closed = false;
  private readonly listeners = new Set<(change: CircuitStateChange) => void>();
  private failureCount = 0;
  private openCount = 0;
  private rejectedCount = 0;

  /** Current state first, then every change. */
  readonly state$: Observable<CircuitState>;

  constructor(options: CircuitBreakerOptions) {
    this.options = parseOptions(breakerOptionsSchema(), options, `CircuitBreaker${options?.name ? ` "${options.name}"` : ''} options`);
    this.name = this.options.name ?? `breaker-${++unnamed}`;
    this.scheduler = this.options.scheduler ?? asyncScheduler;
    this.subject = new BehaviorSubject<CircuitState>('closed');
    this.state$ = this.subject.pipe(distinctUntilChanged());
    if (this.options.onStateChange) this.listeners.add(this.options.onStateChange);
  }

  /** `closed`, `open` or `half-open`, as of now. */
  get state(): CircuitState {
    return this.subject.value;
  }

  /** Failures counted, openings and refused calls since the breaker was made. */
  get counts(): CircuitCounts {
    return { failures: this.failureCount, opens: this.openCount, rejected: this.rejectedCount };
  }

  /** Calls `listener` on every state change; returns a function that stops it. */
  onStateChange(listener: (change: CircuitStateChange) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Asks leave for one call: a permit, or `CircuitOpenError` thrown when the circuit refuses. */
  acquire(): CircuitPermit {
    if (this.closed && this.state === 'open' && this.scheduler.now() - this.openedAt >= this.options.cooldown) this.transition('half-open');
    const state = this.state;
    if (state === 'open') {
      this.rejectedCount++;
      throw new CircuitOpenError(this.name, 'open', Math.max(0, this.openedAt + this.options.cooldown - this.scheduler.now()));
    }
    if (state === 'half-open') {
      // Every probe slot taken: the wait is a whole cooldown if they fail, which is what we can promise.
      if (this.probesInFlight >= this.options.probes) {
        this.rejectedCount++;
        throw new CircuitOpenError(this.name, 'half-open', this.options.cooldown);
      }
      this.probesInFlight++;
    }
    return this.permit(this.epoch, state === 'half-open');
  }

  /**
   * Stops the cooldown timer, so a breaker left open does not hold the process (a server
   * shutting down). The circuit keeps its state; an open one half-opens when next asked
   * after its cooldown.
   */
  close(): void {
    this.closed = true;
    this.cooldownTimer?.unsubscribe();
    this.cooldownTimer = undefined;
  }

  /** `work` guarded by this breaker: see `withCircuitBreaker`. */
  wrap<I, O>(work: Work<I, O>): StreamWork<I, O> {
    return withCircuitBreaker(work, this, this.scheduler);
  }

  /** Back to closed now, failures forgotten (an operator's manual override). */
  reset(): void {
    this.transition('closed');
  }

  private permit(epoch: number, probe: boolean): CircuitPermit {
    let settled = false;
    const settle = (outcome: 'success' | 'failure' | 'release', error?: unknown): void => {
      if (settled) return;
      settled = true;
      if (epoch !== this.epoch) return;
      if (probe) this.probesInFlight--;
      if (outcome === 'success') this.succeeded(probe);
      else if (outcome === 'failure' && (this.options.isFailure?.(error) ?? true)) this.failed(probe);
    };
    return {
      success: () => settle('success'),
      failure: (error) => settle('failure', error),
      release: () => settle('release'),
    };
  }

  private succeeded(probe: boolean): void {
    if (!probe) return;
    if (++this.successes >= this.options.successThreshold) this.transition('closed');
  }

  private failed(probe: boolean): void {
    this.failureCount++;
    if (probe) {
      this.transition('open');
      return;
    }
    const now = this.scheduler.now();
    this.failures.push(now);
    if (this.failures.length > this.options.failureThreshold) this.failures.shift(); // bounded by the threshold
    if (this.failures.length === this.options.failureThreshold && now - this.failures[0]! < this.options.window) this.transition('open');
  }

  private transition(to: CircuitState): void {
    const from = this.state;
    this.epoch++;
    this.failures = [];
    this.successes = 0;
    this.probesInFlight = 0;
    this.cooldownTimer?.unsubscribe();
    this.cooldownTimer = undefined;
    if (to === 'open') {
      this.openCount++;
      this.openedAt = this.scheduler.now();
      if (!this.closed)
        this.cooldownTimer = this.scheduler.schedule(() => {
          this.cooldownTimer = undefined;
          this.transition('half-open');
        }, this.options.cooldown);
    }
    if (from === to) return;
    this.subject.next(to);
    const change: CircuitStateChange = { breaker: this.name, from, to, at: this.scheduler.now() };
    for (const listener of [...this.listeners]) listener(change);
  }
}

/**
 * Guards a work function with a `CircuitBreaker`: while the circuit is open the call
 * is not made and the stream fails at once with `CircuitOpenError` (code
 * `CIRCUIT_OPEN`, with `retryAfter` in ms); otherwise the call runs and its outcome
 * (completed, errored, cancelled) is reported to the breaker.
 *
 * ```
 * breaker:   closed        open
 * tokens:    -a-b|         (not called)
 * output:    -a-b|         #               CircuitOpenError { retryAfter }
 * ```
 *
 * ## Example
 * ```ts
 * const breaker = new CircuitBreaker({ failureThreshold: 5, window: 10_000, cooldown: 30_000 });
 * prompts.pipe(stage(fallback([withCircuitBreaker(callGpu, breaker), callCpu]), { name: 'infer' }));
 * ```
 *
 * `scheduler` only paces waits of the demand link; the breaker's own timers use the
 * breaker's scheduler.
 *
 * @see CircuitBreaker (`breaker.wrap(work)` is the same).
 */
export function withCircuitBreaker<I, O>(work: Work<I, O>, breaker: CircuitBreaker, scheduler: SchedulerLike = asyncScheduler): StreamWork<I, O> {
  return (value, context) => new Flow<O>((outlet) => new GuardedRun(work, value, context, breaker, scheduler, outlet));
}

class GuardedRun<I, O> implements Producer {
  private relay: Relay<O> | undefined;
  private attempt: AttemptContext | undefined;
  private permit: CircuitPermit | undefined;

  constructor(
    private readonly work: Work<I, O>,
    private readonly value: I,
    private readonly context: StageContext,
    private readonly breaker: CircuitBreaker,
    private readonly scheduler: SchedulerLike,
    private readonly outlet: Outlet<O>,
  ) {}

  start(): void {
    let permit: CircuitPermit;
    try {
      permit = this.breaker.acquire();
    } catch (err) {
      this.outlet.error(err);
      return;
    }
    this.permit = permit;
    const attempt = (this.attempt = new AttemptContext(this.context));
    this.relay = new Relay<O>(() => this.outlet.wants(), this.scheduler, {
      output: (output) => this.outlet.next(output),
      error: (err) => {
        attempt.release();
        permit.failure(err);
        this.outlet.error(err);
      },
      complete: () => {
        attempt.release();
        permit.success();
        this.outlet.complete();
      },
    });
    this.relay.start(() => this.work(this.value, attempt));
  }

  pull(): void {
    this.relay?.resume();
  }

  cancel(): void {
    if (this.relay === undefined || this.relay.closed) return;
    this.relay.close();
    this.permit?.release();
    this.attempt?.abort(new AbortedError(this.context.stage, 'the consumer cancelled'));
  }
}
