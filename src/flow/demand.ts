/**
 * The demand protocol: how a sluice `Flow` learns how much its consumer can take.
 *
 * A `Flow<T>` is an RxJS `Observable<T>`. Subscribed by a plain subscriber it has
 * unbounded demand and behaves like any cold Observable. Subscribed by a sluice stage
 * (or through `subscribeWithDemand`) it is *linked* to its consumer and emits only
 * while the consumer `wants()` more — Reactive Streams `request(n)` semantics,
 * without a new subscribe API.
 *
 * ## How a link is made
 *
 * RxJS subscribes a `pipe()` chain synchronously from the last operator to the
 * first, and `Observable.lift` returns a plain Observable, so nothing can ride on the
 * class of the Observable through `map` or `filter`. Instead a consumer opens a
 * *link scope* while it subscribes its source: every Flow whose subscription starts
 * inside that synchronous window links to the consumer. That reaches through any
 * plain operator that subscribes its source synchronously (`map`, `filter`, `tap`,
 * `scan`, `take`, `merge`, `concat`...). An outlet also opens its link's scope
 * while it emits, so Flows that plain operators subscribe *because of* an element
 * (the inner Flows of `mergeMap`, `concatMap`, `switchMap`) link to the same
 * consumer and are paused with the rest.
 *
 * ## Why demand is a question, not a credit
 *
 * Between stages, demand is asked (`wants()`) before every element rather than
 * granted as credits: a `filter` between two stages swallows elements, and credits
 * granted for them would leak until the pipeline stalls. Asking again after every
 * element cannot leak. Explicit credits (`request(n)`) exist for consumers that want
 * them — the test kit, or code bridging to another Reactive Streams library.
 *
 * Between two stages linked straight to each other (nothing in between to swallow an
 * element) the answer is taken as a credit: a stage's room shrinks only by the
 * elements its producer sends, so the producer asks once per room's worth, not once
 * per element (`UpstreamHandler.lendsRoom`).
 *
 * ## Plain operators that defer elements
 *
 * An operator that holds elements and emits them later (`delay`, `observeOn`,
 * `mergeMap` over Promises) hides them from the consumer, and so does one that drops
 * them (`filter`). An element that did not arrive during its producer's `next` call
 * is *in transit* and counts against the consumer's room until it arrives, or until
 * evidence shows it was dropped: a later element arriving synchronously, or a
 * scheduler tick passing without it. The segment between two stages therefore holds
 * a bounded number of elements (its room, plus a small documented slack before the
 * first deferred element comes back), and a filter never leaks demand. See `Inlet`.
 *
 * Rules kept (Reactive Streams numbering): never more than requested (§1.1), serial
 * signals (§1.3), nothing after a terminal signal or cancel (§1.7, §3.6), additive
 * demand (§3.8), non-positive request errors the stream (§3.9), unbounded demand
 * without overflow (§3.17), and re-entrant demand is trampolined, never recursive (§3.3).
 */
import { Observable, type Observer, type Subscriber } from 'rxjs';
import { Traced, traceOf, type TraceRef } from '../core/trace.js';

export type { DemandLink, Resumable } from './protocol.js';
/** @internal */
export type { DirectConsumer, TracedSink } from './protocol.js';
import { FLOW, type DemandLink, type DirectConsumer, type Resumable, type TracedSink } from './protocol.js';
import { subscribeWithDemand, type DemandSubscription } from './subscribe-with-demand.js';
export { subscribeWithDemand, type DemandSubscription } from './subscribe-with-demand.js';
import { currentLink, swapLink } from './link-scope.js';
/** @internal */
export { currentLink, swapLink, withLink } from './link-scope.js';
import { activeIntrospector, currentWithin, isInspectedRun } from './introspection.js';

/**
 * A producer's view of its consumer: what a `Flow` producer calls to emit. Every method checks
 * the consumer's state itself, so a producer may call them at any time; emit only while `wants()`.
 */
export interface Outlet<T> {
  /** True once the Flow has ended or its consumer has left: emit nothing more. */
  readonly closed: boolean;
  /** True while the consumer can take one more element now (§1.1: emit only then). */
  wants(): boolean;
  /**
   * How many elements the consumer would take now: 0 when closed, `Infinity` for a consumer that
   * does not speak demand. For producers that fetch in batches (a remote queue); others ask `wants()`.
   */
  demand(): number;
  /** Emits one element (ignored once `closed`). */
  next(value: T): void;
  /** Ends the Flow with an error; the producer is cancelled first. */
  error(err: unknown): void;
  /** Ends the Flow; the producer is cancelled first. */
  complete(): void;
}

/**
 * The outlet sluice's own operators get: the public `Outlet` plus the hot-path methods that skip
 * checks their callers have already made.
 * @internal
 */
export interface CoreOutlet<T> extends Outlet<T> {
  /**
   * `wants()` for an output of settled async work, asked from the work's callback (a microtask) once
   * its task was found open: it does not look whether the subscriber has left. A subscriber closes
   * in `unsubscribe()`, which runs our teardown (closing every task) before it returns, and no
   * microtask runs in between; one that left inside a synchronous subscribe had our teardown run
   * as it was registered, before any microtask.
   */
  wantsSettled(): boolean;
  /**
   * Emits the traced element `new Traced(value, trace)` (Flows of traced elements only).
   * A sluice operator linked directly gets the parts: no envelope is made for the hop.
   */
  nextTraced(value: TracedValue<T>, trace: TraceRef): void;
  /**
   * `nextTraced` for an output of settled async work: the same, by a path of its own, so
   * async hops do not share the synchronous hop's type feedback (rules atop stage/run.ts).
   * Only for an unsampled element: the receiver does not look (a sampled one goes by `nextTraced`).
   * Only right after `wants()` returned true, with no user code run since: it does not look whether
   * the consumer has left either.
   */
  nextSettled(value: TracedValue<T>, trace: TraceRef): void;
}

/** The payload type of a Flow of traced elements. */
export type TracedValue<T> = T extends Traced<infer V> ? V : never;

/** The producing side of a Flow, one per subscription. */
export interface Producer {
  /** Subscribe upstream, open files... Called once, after the outlet is linked. */
  start?(): void;
  /** Demand is available: emit while `outlet.wants()`. Never called re-entrantly. */
  pull(): void;
  /** The consumer went away (unsubscribe, cancel, or after a terminal signal). Release everything. */
  cancel(): void;
}

class FlowOutlet<T> implements CoreOutlet<T>, Resumable {
  private ended = false;
  private producer: Producer | undefined;
  private pulling = false;
  private pullAgain = false;

  /** Set when the subscriber is the linked consumer itself (no plain operator in between). */
  private readonly direct: DirectConsumer<T> | undefined;
  /** A direct consumer that lends its room: elements it said it can take that have not been emitted yet. */
  private readonly borrows: boolean;
  private credit = 0;
  /** The direct consumer's own handler of traced parts, called straight: one call per hop instead of two. */
  private readonly sink: TracedSink | undefined;

  constructor(
    private readonly subscriber: Subscriber<T>,
    readonly link: DemandLink | undefined,
  ) {
    const candidate = subscriber as Partial<DirectConsumer<T>>;
    this.direct = link !== undefined && candidate.directLink === link ? (candidate as DirectConsumer<T>) : undefined;
    this.borrows = this.direct?.lendsRoom === true && typeof link?.credit === 'function';
    this.sink = this.direct?.tracedSink;
  }

  bind(producer: Producer): void {
    this.producer = producer;
  }

  /** Ended, or the consumer left (a consumer that ends inside a synchronous subscribe, `take(1)`, does so before our teardown is even registered). */
  get closed(): boolean {
    return this.ended || this.subscriber.closed;
  }

  /**
   * Asked before every element. Through plain operators the consumer is asked every
   * time (a `filter` may swallow what was granted). A direct consumer that lends its
   * room is asked once per room's worth: nothing but our own elements can fill it, so
   * what it said stays true until we have emitted that many (figures in `docs/internals/`).
   */
  wants(): boolean {
    // `=== true`: V8 has no type for a boolean field, and a bare test is a full ToBoolean (see stage.ts).
    if (this.ended === true || this.subscriber.closed === true) return false;
    if (this.credit > 0) return true;
    return this.link === undefined || this.ask(this.link);
  }

  wantsSettled(): boolean {
    if (this.ended === true) return false;
    if (this.credit > 0) return true;
    return this.link === undefined || this.ask(this.link);
  }

  demand(): number {
    if (this.ended === true || this.subscriber.closed === true) return 0;
    return this.link === undefined ? Number.POSITIVE_INFINITY : this.link.demand(this);
  }

  private ask(link: DemandLink): boolean {
    if (!link.wants(this)) return false;
    if (this.borrows === true) this.credit = link.credit!(this);
    return true;
  }

  revoke(): void {
    this.credit = 0;
  }

  next(value: T): void {
    if (this.ended === true || this.subscriber.closed === true) return;
    // The hot path between two stages stays short (rules atop stage/run.ts); the rest is in `emit`.
    if (this.direct !== undefined) {
      if (this.credit > 0) this.credit--;
      this.direct.askedNext(value);
    } else {
      this.emit(value);
    }
  }

  nextTraced(value: TracedValue<T>, trace: TraceRef): void {
    if (this.ended === true || this.subscriber.closed === true) return;
    // Every hop between two stages passes here: the envelope would be one allocation per element per stage.
    // The subscriber is not closed (checked above), which is all it would check itself.
    if (this.sink !== undefined) {
      if (this.credit > 0) this.credit--;
      this.sink.onTracedNext(value, trace);
    } else {
      this.emitTraced(value, trace);
    }
  }

  /**
   * `nextTraced` on purpose apart (a shared helper would share the V8 feedback this copy exists to
   * keep apart), less its test of `closed`: it is called right after `wants()` said yes, with no
   * user code run in between (see `Outlet.nextSettled`).
   */
  nextSettled(value: TracedValue<T>, trace: TraceRef): void {
    if (this.sink !== undefined) {
      if (this.credit > 0) this.credit--;
      this.sink.onSettledNext(value, trace);
    } else {
      this.emitTraced(value, trace);
    }
  }

  /** Out of line: its bytecode would count against the inlining budget of every stage hop. */
  private emitTraced(value: TracedValue<T>, trace: TraceRef): void {
    if (this.direct !== undefined) {
      if (this.credit > 0) this.credit--;
      this.direct.tracedNext(value, trace);
    } else {
      this.emit(new Traced(value, traceOf(trace)) as T);
    }
  }

  /** To a plain subscriber (unbounded demand), or through plain operators to the linked consumer. */
  private emit(value: T): void {
    const link = this.link;
    if (link === undefined) {
      this.subscriber.next(value);
      return;
    }
    const token = link.beforeEmit();
    const previous = swapLink(link); // inner Flows subscribed because of this element link to the same consumer
    try {
      this.subscriber.next(value);
    } finally {
      swapLink(previous);
      link.afterEmit(token, this);
    }
  }

  error(err: unknown): void {
    if (this.ended) return;
    this.close();
    this.signal(() => this.subscriber.error(err));
  }

  complete(): void {
    if (this.ended) return;
    this.close();
    this.signal(() => this.subscriber.complete());
  }

  /** Flows subscribed because this one ended (`concatMap`'s next inner, `catchError`'s fallback) link to the same consumer. */
  private signal(terminal: () => void): void {
    const previous = swapLink(this.link);
    try {
      terminal();
    } finally {
      swapLink(previous);
    }
  }

  /** Trampolined: demand signalled while the producer is already emitting only makes it loop again (§3.3). */
  resume(): void {
    if (this.ended === true || this.producer === undefined) return;
    if (this.pulling === true) {
      this.pullAgain = true;
      return;
    }
    this.pulling = true;
    try {
      do {
        this.pullAgain = false;
        this.producer.pull();
      } while (this.pullAgain && !this.ended);
    } finally {
      this.pulling = false;
    }
  }

  /** The subscriber's finalizer (RxJS calls `unsubscribe` on an object it was given with `add`). */
  unsubscribe(): void {
    this.close();
  }

  close(): void {
    if (this.ended) return;
    this.ended = true;
    this.link?.detach(this);
    const producer = this.producer;
    this.producer = undefined;
    producer?.cancel();
  }
}

/** The subscribe function of every Flow (`this` is the Flow): links the outlet, starts the producer, pulls. */
function subscribeFlow<T>(this: Observable<T>, subscriber: Subscriber<T>): void {
  const outlet = new FlowOutlet<T>(subscriber, currentLink());
  const producer = (this as Flow<T>).produce(outlet);
  outlet.bind(producer);
  outlet.link?.attach(outlet);
  // Before the first element: a consumer that leaves inside a synchronous subscribe cancels us there and then.
  // The outlet is the finalizer itself (`unsubscribe`): no closure per subscription.
  subscriber.add(outlet);
  // Told before it starts, so the runs it subscribes find its link already known.
  const introspector = activeIntrospector();
  if (introspector !== undefined && isInspectedRun(producer)) {
    introspector.runStarted(producer, producer.ownLink(), outlet.link, currentWithin());
    subscriber.add(() => introspector.runEnded(producer));
  }
  // Subscribing our own upstream must not link it to *our* consumer.
  const previous = swapLink(undefined);
  try {
    producer.start?.();
    // Linking happens at subscribe time only: elements emitted now are not subscriptions.
    outlet.resume();
  } finally {
    swapLink(previous);
  }
}

/**
 * An RxJS Observable that speaks demand. Build one from a producer factory; most
 * users get Flows from sources (`fromIterable`...) and stages instead.
 */
export class Flow<T> extends Observable<T> {
  /** @internal Makes the producer of one subscription. */
  readonly produce: (outlet: CoreOutlet<T>) => Producer;

  /** @internal sluice's own operators get the outlet with its unchecked hot-path methods. */
  constructor(produce: (outlet: CoreOutlet<T>) => Producer);
  /** A Flow whose `produce` makes the producer of each subscription, given that subscription's outlet. */
  constructor(produce: (outlet: Outlet<T>) => Producer);
  constructor(produce: (outlet: CoreOutlet<T>) => Producer) {
    // One shared subscribe function (RxJS calls it with the Flow as `this`): a closure per Flow lived as long as the Flow.
    super(subscribeFlow);
    this.produce = produce;
  }

  /**
   * Subscribes with explicit Reactive Streams demand: nothing is emitted until
   * `request(n)`. Demand is additive and saturates at `Infinity` (§3.8, §3.17); a
   * non-positive or non-integer `n` errors the stream with `IllegalDemandError`
   * (§3.9); `request` after `cancel` is a no-op (§3.6).
   */
  subscribeWithDemand(observer: Partial<Observer<T>>): DemandSubscription {
    return subscribeWithDemand(this, observer);
  }
}
// On the prototype, not a field: `subscribeWithDemand` tells a bare Flow without importing this module.
Object.defineProperty(Flow.prototype, FLOW, { value: true });

/** True when `source` is a sluice Flow (speaks demand directly). */
export function isFlow<T>(source: Observable<T>): source is Flow<T> {
  return source instanceof Flow;
}
