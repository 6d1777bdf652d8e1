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
import { Observable, UnsubscriptionError, type Observer, type Subscriber, type Subscription, type TeardownLogic, type Unsubscribable } from 'rxjs';
import { IllegalDemandError } from '../core/errors.js';
import { Traced, traceOf, type TraceRef } from '../core/trace.js';
import { Inlet, type RoomOwner } from './inlet.js';
import { Ring } from './ring.js';

export type { DemandLink, Resumable } from './protocol.js';
import type { DemandLink, Resumable } from './protocol.js';
import { activeIntrospector, currentWithin, isInspectedRun } from './introspection.js';
import { reportUnhandledError } from './report.js';

/** A producer's view of its consumer. */
export interface Outlet<T> {
  readonly closed: boolean;
  /** True while the consumer can take one more element now (§1.1: emit only then). */
  wants(): boolean;
  /**
   * `wants()` for an output of settled async work, asked from the work's callback (a microtask) once
   * its task was found open: it does not look whether the subscriber has left. A subscriber closes
   * in `unsubscribe()`, which runs our teardown (closing every task) before it returns, and no
   * microtask runs in between; one that left inside a synchronous subscribe had our teardown run
   * as it was registered, before any microtask.
   */
  wantsSettled(): boolean;
  /**
   * How many elements the consumer would take now: 0 when closed, `Infinity` for a consumer that
   * does not speak demand. For producers that fetch in batches (a remote queue); others ask `wants()`.
   */
  demand(): number;
  next(value: T): void;
  /**
   * Emits the traced element `new Traced(value, trace)` (Flows of traced elements only).
   * A sluice operator linked directly gets the parts: no envelope is made for the hop.
   */
  nextTraced(value: TracedValue<T>, trace: TraceRef): void;
  /**
   * `nextTraced` for an output of settled async work: the same, by a path of its own. V8
   * keeps its feedback per function, so async hops compile apart from synchronous ones
   * (whose whole hop must fit one inlining budget) instead of sharing every decision.
   * Only for an unsampled element: the receiver does not look (a sampled one goes by `nextTraced`).
   * Only right after `wants()` returned true, with no user code run since: it does not look whether
   * the consumer has left either.
   */
  nextSettled(value: TracedValue<T>, trace: TraceRef): void;
  error(err: unknown): void;
  complete(): void;
}

/** A consumer of traced elements as their parts. @internal */
export interface TracedSink {
  onTracedNext(value: unknown, trace: TraceRef): void;
  /** `onTracedNext` for an element from settled async work (see `Outlet.nextSettled`). */
  onSettledNext(value: unknown, trace: TraceRef): void;
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

let scope: DemandLink | undefined;

/** Runs `fn` with `link` as the link scope: Flows subscribed synchronously inside link to it. */
export function withLink<R>(link: DemandLink | undefined, fn: () => R): R {
  const previous = scope;
  scope = link;
  try {
    return fn();
  } finally {
    scope = previous;
  }
}

/** The link scope currently open, if any. */
export function currentLink(): DemandLink | undefined {
  return scope;
}

/**
 * Opens `link` as the scope and returns the previous one, for hot paths that cannot
 * afford a closure; the caller must restore it with `swapLink(previous)`.
 * @internal
 */
export function swapLink(link: DemandLink | undefined): DemandLink | undefined {
  const previous = scope;
  scope = link;
  return previous;
}

/**
 * A subscriber that is its consumer's own, subscribed with `link`: every element it
 * gets from a Flow linked to `link` was asked for and arrives during the emit, so the
 * outlet skips the in-transit bookkeeping and hands elements over directly.
 * @internal
 */
export interface DirectConsumer<T> {
  readonly directLink: DemandLink;
  askedNext(value: T): void;
  /** A traced element as its parts (`nextTraced`), for a consumer without a `tracedSink`: it makes the envelope. */
  tracedNext(value: unknown, trace: TraceRef): void;
  /** Takes traced elements as parts itself, if it does: the outlet calls it without the subscriber in between. */
  readonly tracedSink: TracedSink | undefined;
  /** The consumer's room shrinks only by this producer's elements: the producer may take all of it as credit (see `FlowOutlet.wants`). */
  readonly lendsRoom: boolean;
}

class FlowOutlet<T> implements Outlet<T>, Resumable {
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
   * what it said stays true until we have emitted that many (asking had cost up to a
   * fifth of a stage hop's instructions).
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
    // The hot path between two stages stays small enough for V8 to inline; the rest is in `emit`.
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
    const previous = scope;
    scope = link; // inner Flows subscribed because of this element link to the same consumer
    try {
      this.subscriber.next(value);
    } finally {
      scope = previous;
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
    const previous = scope;
    scope = this.link;
    try {
      terminal();
    } finally {
      scope = previous;
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
  const outlet = new FlowOutlet<T>(subscriber, scope);
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
  readonly produce: (outlet: Outlet<T>) => Producer;

  constructor(produce: (outlet: Outlet<T>) => Producer) {
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

/** A subscription with Reactive Streams demand. */
export interface DemandSubscription {
  request(n: number): void;
  cancel(): void;
  readonly closed: boolean;
  /** Demand granted and not yet used. */
  readonly outstanding: number;
}

/**
 * Subscribes to any Observable with explicit demand. A Flow (or a chain of plain
 * operators over Flows) honours it; a plain Observable cannot be paused and pushes
 * regardless — `request` then only records what was asked.
 *
 * A credit is used when an element *arrives*, not when a Flow emits it, so demand
 * does not leak through plain operators: an element a `filter` drops uses none, and
 * the inner Flows of a `mergeMap` use the credits rather than the outer element. An
 * element that does not arrive during its emit holds its credit until it arrives or
 * the link gives up on it (see `Inlet`); if one it gave up on arrives after all, with
 * no credit left, it waits here for the next `request`: the observer never gets more
 * than it asked for (§1.1), and such early elements are bounded by the elements the
 * link gave up on.
 */
export function subscribeWithDemand<T>(
  source: Observable<T>,
  observer: Partial<Observer<T>>,
  /** Told the link the source is subscribed through, before it is (an inspector's consumer node). @internal */
  onLink?: (link: DemandLink) => void,
): DemandSubscription {
  // A bare Flow's outlet is its only producer and hands it every element itself: no Inlet to tell asked elements from pushed ones.
  const subscriber: DemandSubscriber<T> = source instanceof Flow ? new DirectDemandSubscriber(observer) : new LinkedDemandSubscriber(observer);
  onLink?.(subscriber.demandLink);
  subscriber.subscribe(source);
  return subscriber;
}

/** What a source may register to be torn down with its subscriber (RxJS's `TeardownLogic`, less `void`). */
type Finalizer = Subscription | Unsubscribable | (() => void);

function finalize(finalizer: Finalizer, errors: unknown[] | undefined): unknown[] | undefined {
  try {
    if (typeof finalizer === 'function') finalizer();
    else finalizer.unsubscribe();
  } catch (err) {
    (errors ??= []).push(err);
  }
  return errors;
}

/**
 * `subscribeWithDemand`'s state, one object: the subscription it returns, its link's room, and
 * the subscriber its source sees. It is an RxJS subscriber by shape (`next`, `error`, `complete`,
 * `closed`, `add`, `remove`, `unsubscribe`), so `subscribe` uses it as it is, as it does a
 * `Subscriber`: RxJS's `SafeSubscriber`, its observer wrapper and its array of finalizers cost a
 * server ~200 bytes that lived as long as each request. What `SafeSubscriber` did is kept: a throw
 * from the observer during a signal of the source is reported (`config.onUnhandledError`), never
 * thrown into the source; nothing from the source is taken after its terminal signal or after
 * `cancel`; the source's finalizers run after the observer got the terminal signal.
 */
abstract class DemandSubscriber<T> implements DemandSubscription {
  private credits = 0;
  /** Nothing more reaches the observer: its terminal signal was delivered, or demand was illegal, or cancelled. */
  private failed = false;
  /** The source is done with us: it signalled its end, or we unsubscribed. What RxJS calls a subscriber's `closed`. */
  private stopped = false;
  /** `subscribe` returned: a `request` made during it (from a synchronous source's signal) is ignored, as before it. */
  private subscribed = false;
  /** What the source registered to be torn down with us: the first in a field (a Flow's outlet), more in an array made for them. */
  private finalizer: Finalizer | undefined;
  private finalizers: Finalizer[] | undefined;
  /** Elements that arrived with no credit left (a deferring operator returned what the link had given up on): they wait for `request` (§1.1). Made on first use. */
  private early: Ring<T> | undefined;
  private ended: { error: unknown } | 'complete' | undefined;
  private delivering = false;

  /** @internal The link its source is subscribed through. */
  abstract get demandLink(): DemandLink;
  /** An element came: whether it was asked for (a source that cannot be paused pushes regardless). */
  protected abstract arrived(): boolean;
  /** Producers that speak demand are linked: what they send beyond the credits waits in `early`. */
  protected abstract producing(): boolean;
  /** No more elements will be asked for. */
  protected abstract closeLink(): void;
  /** Credits came: resume the producers that were told no. */
  protected abstract signalLink(): void;

  constructor(private readonly observer: Partial<Observer<T>>) {}

  subscribe(source: Observable<T>): void {
    const previous = swapLink(this.demandLink);
    try {
      // This object is the subscriber too (RxJS calls `next`, `error`, `complete` and `add` on it).
      source.subscribe(this);
    } finally {
      swapLink(previous);
    }
    this.subscribed = true;
  }

  /** The link's room: credits not yet taken by elements waiting in `early`. */
  room(): number {
    return this.failed || this.stopped ? 0 : Math.max(0, this.credits - this.waiting());
  }

  private waiting(): number {
    return this.early === undefined ? 0 : this.early.length;
  }

  private deliver(): void {
    if (this.delivering) return; // re-entrant request: the loop below goes on
    this.delivering = true;
    try {
      while (this.waiting() > 0 && this.credits > 0 && !this.failed) {
        if (this.credits !== Infinity) this.credits--;
        this.observer.next?.(this.early!.shift() as T);
      }
      if (this.waiting() === 0 && this.ended !== undefined && !this.failed) {
        const end = this.ended;
        this.ended = undefined;
        this.failed = true; // nothing more after a terminal signal
        if (end === 'complete') this.observer.complete?.();
        else this.observer.error?.(end.error);
      }
    } finally {
      this.delivering = false;
    }
  }

  /** @internal From the source. */
  next(value: T): void {
    if (this.stopped) return;
    try {
      const asked = this.arrived();
      // A source that cannot be paused pushes regardless (documented); what a Flow sent waits for credit.
      if ((asked || this.producing()) && (this.credits === 0 || this.waiting() > 0)) {
        (this.early ??= new Ring<T>(2)).push(value);
        return;
      }
      if (this.credits !== Infinity) this.credits--;
      this.observer.next?.(value);
    } catch (err) {
      reportUnhandledError(err);
    }
  }

  /** @internal From the source. */
  error(err: unknown): void {
    this.end({ error: err });
  }

  /** @internal From the source. */
  complete(): void {
    this.end('complete');
  }

  private end(how: { error: unknown } | 'complete'): void {
    if (this.stopped) return;
    this.stopped = true;
    try {
      this.closeLink();
      this.ended = how;
      this.deliver();
    } catch (err) {
      reportUnhandledError(err);
    } finally {
      this.teardown();
    }
  }

  request(n: number): void {
    if (!this.subscribed || this.failed) return;
    if (!(n > 0) || !Number.isInteger(n)) {
      if (n !== Infinity) {
        this.failed = true;
        this.closeLink();
        this.unsubscribe();
        this.early?.drain();
        this.observer.error?.(new IllegalDemandError(n));
        return;
      }
    }
    this.credits = this.credits + n >= Number.MAX_SAFE_INTEGER ? Infinity : this.credits + n;
    if (this.waiting() > 0 || this.ended !== undefined) this.deliver();
    if (!this.stopped) this.signalLink();
  }

  cancel(): void {
    this.closeLink();
    this.early?.drain();
    this.ended = undefined;
    this.failed = true;
    this.unsubscribe();
  }

  get closed(): boolean {
    return this.failed;
  }

  get outstanding(): number {
    return this.credits;
  }

  /** @internal RxJS's `Subscription.add`: `finalizer` runs when the source is done with us (at once if it already is). */
  add(finalizer: TeardownLogic): void {
    if (finalizer === undefined || finalizer === null || (finalizer as unknown) === this) return;
    if (this.stopped) {
      const errors = finalize(finalizer, undefined);
      if (errors !== undefined) throw new UnsubscriptionError(errors);
      return;
    }
    if (this.finalizer === undefined) this.finalizer = finalizer;
    else (this.finalizers ??= []).push(finalizer);
  }

  /** @internal RxJS's `Subscription.remove`. */
  remove(finalizer: Exclude<TeardownLogic, void>): void {
    if (this.finalizer === finalizer) this.finalizer = undefined;
    else if (this.finalizers !== undefined) {
      const index = this.finalizers.indexOf(finalizer);
      if (index !== -1) this.finalizers.splice(index, 1);
    }
  }

  /** @internal RxJS's `Subscription.unsubscribe`: the source is done with us; use `cancel` to end the subscription. */
  unsubscribe(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.teardown();
  }

  private teardown(): void {
    const first = this.finalizer;
    const more = this.finalizers;
    this.finalizer = this.finalizers = undefined;
    let errors = first === undefined ? undefined : finalize(first, undefined);
    if (more !== undefined) for (const finalizer of more) errors = finalize(finalizer, errors);
    if (errors !== undefined) throw new UnsubscriptionError(errors);
  }
}

/**
 * The general path: through plain operators, whose elements may be dropped or held, an `Inlet`
 * tells elements that were asked for from pushed ones and keeps demand from leaking (see `Inlet`).
 */
class LinkedDemandSubscriber<T> extends DemandSubscriber<T> implements RoomOwner {
  // The link's grace may pull a few elements ahead of the credits before a deferral is seen: they wait in `early` (§1.1).
  private readonly link: Inlet = new Inlet(this);

  get demandLink(): DemandLink {
    return this.link;
  }

  protected arrived(): boolean {
    return this.link.arrive();
  }

  protected producing(): boolean {
    return this.link.producers > 0;
  }

  protected closeLink(): void {
    this.link.close();
  }

  protected signalLink(): void {
    this.link.signal();
  }
}

/**
 * The fast path for a bare Flow: its outlet is the only producer, asks this object itself before
 * each element and hands the element over straight (`DirectConsumer`), so every element was asked
 * for and none is ever in transit: no `Inlet` (~300 bytes per subscription, and its bookkeeping per
 * element). Proved to deliver what `LinkedDemandSubscriber` delivers in demand.properties.test.ts.
 */
class DirectDemandSubscriber<T> extends DemandSubscriber<T> implements DemandLink, DirectConsumer<T> {
  /** The producers linked to it: the Flow's outlet in a field; more only if the observer subscribes Flows as the source ends. */
  private producer: Resumable | undefined;
  private producers: Resumable[] | undefined;
  /** A producer asked and was told no: credits must resume it. */
  private starved = false;

  get demandLink(): DemandLink {
    return this;
  }

  get directLink(): DemandLink {
    return this;
  }

  get tracedSink(): TracedSink | undefined {
    return undefined;
  }

  get lendsRoom(): boolean {
    return false;
  }

  wants(): boolean {
    if (this.room() > 0) return true;
    this.starved = true;
    return false;
  }

  demand(): number {
    return this.room();
  }

  beforeEmit(): number {
    return 0;
  }

  afterEmit(): void {}

  attach(outlet: Resumable): void {
    if (this.producer === undefined) this.producer = outlet;
    else (this.producers ??= []).push(outlet);
  }

  detach(outlet: Resumable): void {
    if (this.producer === outlet) this.producer = undefined;
    else if (this.producers !== undefined) {
      const index = this.producers.indexOf(outlet);
      if (index !== -1) this.producers.splice(index, 1);
    }
  }

  askedNext(value: T): void {
    this.next(value);
  }

  tracedNext(value: unknown, trace: TraceRef): void {
    this.next(new Traced(value, traceOf(trace)) as T);
  }

  protected arrived(): boolean {
    return true;
  }

  protected producing(): boolean {
    return this.producer !== undefined || (this.producers !== undefined && this.producers.length > 0);
  }

  protected closeLink(): void {}

  protected signalLink(): void {
    if (!this.starved) return;
    this.starved = false;
    this.producer?.resume();
    // A resumed producer may detach (it ended): go through a copy.
    if (this.producers !== undefined) for (const producer of this.producers.slice()) producer.resume();
  }
}

/** True when `source` is a sluice Flow (speaks demand directly). */
export function isFlow<T>(source: Observable<T>): source is Flow<T> {
  return source instanceof Flow;
}
