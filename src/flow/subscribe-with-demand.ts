/**
 * `subscribeWithDemand`: Reactive Streams demand (`request(n)`, `cancel()`) over any Observable.
 * A Flow, or plain operators over Flows, honours it through the consumer's link; a plain
 * Observable cannot be paused, and only what was asked reaches the observer.
 */
import { UnsubscriptionError, type Observable, type Observer, type Subscription, type TeardownLogic, type Unsubscribable } from 'rxjs';
import { IllegalDemandError } from '../core/errors.js';
import { Traced, traceOf, type TraceRef } from '../core/trace.js';
import { Inlet, type RoomOwner } from './inlet.js';
import { Ring } from './ring.js';
import { FLOW, type DemandLink, type DirectConsumer, type Resumable, type TracedSink } from './protocol.js';
import { reportUnhandledError } from './report.js';
import { swapLink } from './link-scope.js';

/** A subscription with Reactive Streams demand. */
export interface DemandSubscription {
  /** Asks for `n` more elements (additive; a non-positive or non-integer `n` errors the stream). */
  request(n: number): void;
  /** Stops the stream: nothing is delivered after it, and the producer is released. */
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
  const subscriber: DemandSubscriber<T> =
    (source as { [FLOW]?: true })[FLOW] === true ? new DirectDemandSubscriber(observer) : new LinkedDemandSubscriber(observer);
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
 * `Subscriber`: no `SafeSubscriber`, observer wrapper or finalizer array lives as long as each
 * request (figures in `docs/internals/`). What `SafeSubscriber` did is kept: a throw
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
 * for and none is ever in transit: no `Inlet`, and none of its bookkeeping per element. Proved to deliver what `LinkedDemandSubscriber` delivers in demand.properties.test.ts.
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
