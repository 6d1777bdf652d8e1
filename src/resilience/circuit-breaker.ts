import { asyncScheduler, type SchedulerLike } from 'rxjs';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import { AbortedError } from '../core/errors.js';
import type { CircuitBreaker, CircuitPermit } from './breaker.js';
import { AttemptContext, Relay, type StreamWork } from './relay.js';
import type { StageContext, Work } from '../operators/stage.js';

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
