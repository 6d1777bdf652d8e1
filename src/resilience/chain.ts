/**
 * The one mechanism behind `retrying` and `fallback`: run attempts one after another
 * until one *answers*, and never start another once an output went downstream.
 *
 * Invariant: outputs of at most one attempt ever reach the outlet — the attempt that
 * emitted first — so a token stream is never duplicated or spliced from two attempts.
 */
import { asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import type { StageContext, WorkResult } from '../flow/work.js';
import { AbortedError } from '../core/errors.js';
import { AttemptContext, Relay } from './relay.js';

export interface AttemptPlan<O> {
  /** Runs attempt `n` (0-based) with its own context. */
  run(n: number, context: StageContext): WorkResult<O>;
  /**
   * Attempt `n` failed before any of its outputs went downstream: how long to wait
   * (ms) before attempt `n + 1`, or `undefined` to give up.
   */
  next(n: number, error: unknown): number | undefined;
  /** Attempt `n` answered: its first output is going downstream, or it completed with none. */
  answered?(n: number): void;
  /** Giving up after attempt `n` failed before answering: the error the stream ends with. Default: that failure. */
  exhausted?(n: number, error: unknown): unknown;
}

/** A cold Flow running `plan`'s attempts for one element. */
export function attemptChain<O>(plan: AttemptPlan<O>, context: StageContext, scheduler: SchedulerLike = asyncScheduler): Flow<O> {
  return new Flow<O>((outlet) => new ChainRun(plan, context, scheduler, outlet));
}

class ChainRun<O> implements Producer {
  private attempt = 0;
  private answered = false;
  private ended = false;
  private relay: Relay<O> | undefined;
  private current: AttemptContext | undefined;
  private timer: Subscription | undefined;

  constructor(
    private readonly plan: AttemptPlan<O>,
    private readonly context: StageContext,
    private readonly scheduler: SchedulerLike,
    private readonly outlet: Outlet<O>,
  ) {}

  start(): void {
    this.begin();
  }

  pull(): void {
    this.relay?.resume();
  }

  cancel(): void {
    if (this.ended) return;
    this.ended = true;
    this.timer?.unsubscribe();
    this.timer = undefined;
    this.relay?.close();
    this.current?.abort(new AbortedError(this.context.stage, 'the consumer cancelled'));
  }

  private begin(): void {
    const n = this.attempt;
    const context = (this.current = new AttemptContext(this.context));
    const relay = (this.relay = new Relay<O>(() => this.outlet.wants(), this.scheduler, {
      output: (value) => {
        if (!this.answered) this.answer(n);
        this.outlet.next(value);
      },
      error: (err) => this.failed(n, context, err),
      complete: () => {
        context.release();
        if (!this.answered) this.answer(n);
        this.ended = true;
        this.outlet.complete();
      },
    }));
    relay.start(() => this.plan.run(n, context));
  }

  private answer(n: number): void {
    this.answered = true;
    this.plan.answered?.(n);
  }

  private failed(n: number, context: AttemptContext, err: unknown): void {
    context.release();
    if (this.ended) return;
    // Once an output went downstream, another attempt would repeat or splice tokens: the failure is final.
    const wait = this.answered || this.callerAborted() ? undefined : this.plan.next(n, err);
    if (wait === undefined) {
      this.ended = true;
      this.outlet.error(this.answered ? err : this.plan.exhausted ? this.plan.exhausted(n, err) : err);
      return;
    }
    this.attempt = n + 1;
    // No timer for no wait: asyncScheduler would turn a 0 ms wait into a setInterval(0) of ~1 ms. Recursion is bounded by the attempts.
    if (wait <= 0) {
      this.begin();
      return;
    }
    this.timer = this.scheduler.schedule(() => {
      this.timer = undefined;
      if (!this.ended) this.begin();
    }, wait);
  }

  /** The caller's signal fired (cancel, stage timeout, kill switch): no attempt may follow. */
  private callerAborted(): boolean {
    return this.context.signal.aborted;
  }
}
