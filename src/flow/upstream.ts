import { Subscriber, type Observable, type Subscription } from 'rxjs';
import { withLink, type DemandLink, type DirectConsumer, type TracedSink, type TracedValue } from './demand.js';
import { Traced, traceOf, type TraceRef } from '../core/trace.js';
import { probeSegment } from './segment-probe.js';

/** What a demand-aware operator does with its upstream's signals. */
export interface UpstreamHandler<T> {
  /**
   * Receives the upstream subscription before the first element: a synchronous source
   * emits inside `subscribe`, and a handler that ends early must be able to stop it there.
   */
  onSubscribe?(subscription: Subscription): void;
  onNext(value: T): void;
  /** An element from a Flow linked straight to this handler's inlet: asked for by construction, no inlet bookkeeping. Default: `onNext`. */
  onAskedNext?(value: T): void;
  /**
   * A traced element from such a Flow, as its parts (no envelope was made for the hop).
   * Default: `onAskedNext(new Traced(value, trace))`.
   */
  onTracedNext?(value: TracedValue<T>, trace: TraceRef): void;
  /** The same, for an output of settled async work upstream (see `Outlet.nextSettled`); taken only beside `onTracedNext`. */
  onSettledNext?(value: TracedValue<T>, trace: TraceRef): void;
  /**
   * True when the handler's room (its `DemandLink`'s answer) shrinks only by the
   * elements it receives, or drops to 0 only after it has unsubscribed upstream: a
   * producer linked straight to it may then take the whole room as credit and ask
   * again only when that is used up. Default false: asked before every element.
   */
  readonly lendsRoom?: boolean;
  onUpstreamError(err: unknown): void;
  onUpstreamComplete(): void;
}

/** Subscribes upstream without RxJS's SafeSubscriber wrapping: one call per element. */
class UpstreamSubscriber<T> extends Subscriber<T> implements DirectConsumer<T> {
  readonly lendsRoom: boolean;
  readonly tracedSink: TracedSink | undefined;
  constructor(
    private readonly handler: UpstreamHandler<T>,
    readonly directLink: DemandLink,
  ) {
    super();
    this.lendsRoom = handler.lendsRoom === true;
    this.tracedSink = handler.onTracedNext && handler.onSettledNext ? (handler as TracedSink) : undefined;
  }
  askedNext(value: T): void {
    if (this.isStopped) return;
    if (this.handler.onAskedNext) this.handler.onAskedNext(value);
    else this.handler.onNext(value);
  }
  /** A traced element for a handler that takes no parts (one that does is the outlet's `tracedSink`, called straight). */
  tracedNext(value: unknown, trace: TraceRef): void {
    this.askedNext(new Traced(value, traceOf(trace)) as T);
  }
  protected override _next(value: T): void {
    this.handler.onNext(value);
  }
  protected override _error(err: unknown): void {
    this.unsubscribe();
    this.handler.onUpstreamError(err);
  }
  protected override _complete(): void {
    this.unsubscribe();
    this.handler.onUpstreamComplete();
  }
}

/**
 * Subscribes `source` with `link` as its demand link: every Flow reached synchronously
 * through plain operators asks `link` before each element. Elements may arrive before
 * this returns (a synchronous source); the returned subscription ends the upstream.
 */
export function subscribeUpstream<T>(source: Observable<T>, link: DemandLink, handler: UpstreamHandler<T>): Subscriber<T> {
  const subscriber = new UpstreamSubscriber<T>(handler, link);
  handler.onSubscribe?.(subscriber);
  withLink(link, () => probeSegment(source, link).subscribe(subscriber));
  return subscriber;
}
