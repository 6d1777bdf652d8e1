/**
 * What the resilience wrappers share: running one attempt of a work function and
 * relaying its outputs to the wrapper's own outlet, with demand passed through (a
 * token Flow or AsyncIterable is paused while the stage above has no room), and a
 * context whose AbortSignal the wrapper can fire on its own (timeout, retry, cancel)
 * without aborting the caller's.
 */
import { Observable, from, of, type SchedulerLike, type Subscription } from 'rxjs';
import type { Flow } from '../flow/demand.js';
import { Inlet, type RoomOwner } from '../flow/inlet.js';
import { fromAsyncIterable } from '../flow/sources.js';
import { subscribeUpstream, type UpstreamHandler } from '../flow/upstream.js';
import type { StageContext, Work, WorkResult } from '../flow/work.js';
import type { TraceContext } from '../core/trace.js';

/** A work function as the wrappers return it: always a (cold) Flow of outputs. */
export type StreamWork<I, O> = (value: I, context: StageContext) => Flow<O>;

/** A work function with a name for traces and errors. */
export interface NamedWorker<I, O> {
  readonly name: string;
  readonly work: Work<I, O>;
}

/** A bare work function (named after the function) or a `{ name, work }` pair. */
export type Worker<I, O> = Work<I, O> | NamedWorker<I, O>;

/** `{ name, work }` for any worker: a bare function is named after itself, else `worker-<index>`. */
export function named<I, O>(worker: Worker<I, O>, index: number): NamedWorker<I, O> {
  if (typeof worker !== 'function') return worker;
  return { name: worker.name && worker.name !== 'work' ? worker.name : `worker-${index}`, work: worker };
}

/** Any work result as an Observable. AsyncIterables become Flows, so they are pulled only on demand. */
export function toObservable<O>(result: WorkResult<O>): Observable<O> {
  if (result instanceof Observable) return result;
  if (result !== null && (typeof result === 'object' || typeof result === 'function')) {
    if (typeof (result as PromiseLike<O>).then === 'function') return from(result as PromiseLike<O>);
    if (typeof (result as AsyncIterable<O>)[Symbol.asyncIterator] === 'function') return fromAsyncIterable(result as AsyncIterable<O>);
  }
  return of(result as O);
}

/**
 * The context one attempt runs with: the caller's, but with a signal of its own that
 * also fires when the caller's does. Like the stage's, the signal is created on first
 * read, so work that never reads it costs no AbortController.
 */
export class AttemptContext implements StageContext {
  private controller: AbortController | undefined;
  private unlink: (() => void) | undefined;
  private reason: { value: unknown } | undefined;

  constructor(private readonly parent: StageContext) {}

  get stage(): string {
    return this.parent.stage;
  }
  get seq(): number {
    return this.parent.seq;
  }
  get trace(): TraceContext {
    return this.parent.trace;
  }

  get signal(): AbortSignal {
    if (this.controller === undefined) {
      const controller = (this.controller = new AbortController());
      if (this.reason !== undefined) {
        controller.abort(this.reason.value);
      } else {
        const parent = this.parent.signal;
        if (parent.aborted) controller.abort(parent.reason);
        else {
          const forward = () => controller.abort(parent.reason);
          parent.addEventListener('abort', forward, { once: true });
          this.unlink = () => parent.removeEventListener('abort', forward);
        }
      }
    }
    return this.controller.signal;
  }

  note(key: string, value: string | number | boolean): void {
    this.parent.note(key, value);
  }

  /** Fires this attempt's signal (not the caller's). */
  abort(reason: unknown): void {
    if (this.reason !== undefined) return;
    this.reason = { value: reason };
    this.controller?.abort(reason);
    this.release();
  }

  /** The attempt is over: stop listening to the caller's signal. */
  release(): void {
    this.unlink?.();
    this.unlink = undefined;
  }
}

/** What a relay reports about its attempt. */
export interface RelayHandler<O> {
  output(value: O): void;
  error(err: unknown): void;
  complete(): void;
}

/**
 * One attempt, relayed: subscribes the work's result with a demand link that has
 * room exactly while `wants()` says the wrapper's consumer does, so a pausable
 * result (a Flow, an AsyncIterable) is paused with the stage above. A plain
 * Observable cannot be paused and is relayed as it pushes.
 */
export class Relay<O> implements RoomOwner, UpstreamHandler<O> {
  private readonly inlet: Inlet;
  private subscription: Subscription | undefined;
  private ended = false;

  constructor(
    private readonly wants: () => boolean,
    scheduler: SchedulerLike,
    private readonly handler: RelayHandler<O>,
  ) {
    this.inlet = new Inlet(this, { scheduler });
  }

  get closed(): boolean {
    return this.ended;
  }

  /** Runs `attempt` and subscribes its result; a throw is the attempt failing. */
  start(attempt: () => WorkResult<O>): void {
    let result: WorkResult<O>;
    try {
      result = attempt();
    } catch (err) {
      this.onUpstreamError(err);
      return;
    }
    const subscription = subscribeUpstream(toObservable(result), this.inlet, this);
    if (this.ended) subscription.unsubscribe();
  }

  room(): number {
    return !this.ended && this.wants() ? 1 : 0;
  }

  /** The consumer has room again: resume the attempt's producer. */
  resume(): void {
    if (!this.ended) this.inlet.signal();
  }

  /** Ends the attempt without a signal to the handler (unsubscribes its result). */
  close(): void {
    if (this.ended) return;
    this.ended = true;
    this.release();
  }

  onSubscribe(subscription: Subscription): void {
    this.subscription = subscription;
  }

  onNext(value: O): void {
    if (this.ended) return;
    this.inlet.arrive();
    this.handler.output(value);
  }

  onAskedNext(value: O): void {
    if (this.ended) return;
    this.handler.output(value);
  }

  onUpstreamError(err: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.release();
    this.handler.error(err);
  }

  onUpstreamComplete(): void {
    if (this.ended) return;
    this.ended = true;
    this.release();
    this.handler.complete();
  }

  private release(): void {
    this.subscription?.unsubscribe();
    this.subscription = undefined;
    this.inlet.close();
  }
}
