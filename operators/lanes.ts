/**
 * Lanes: the machinery `partition`, `balance` and `broadcast` share. One upstream
 * feeds N lanes; each lane is a Flow over its own bounded ring, handed to a user
 * function that builds the lane's pipeline; the lanes' outputs are merged into one
 * output.
 *
 * Demand, both ways:
 * - upstream: the run is the `RoomOwner` of one `Inlet`, and its routing decides
 *   `room()` (partition: the next element's lane may be any lane; balance: any lane
 *   with room; broadcast: every lane). Upstream is paused while there is none.
 * - downstream: every lane's output is subscribed inside the link scope the output
 *   was subscribed in, so each links to the consumer itself and asks it before every
 *   element (see `mergeFlows`). The output is therefore a plain Observable, not a
 *   Flow: wrapping it in a Flow would make each element pass two outlets of one link
 *   and be counted twice.
 *
 * Accounting: every element that enters leaves exactly once per copy (broadcast
 * makes one copy per lane): handed to its lane's consumer (`delivered`), `shed` with
 * a reason, or `failed` when the run errors.
 */
import { Observable, type SchedulerLike, type Subscriber, type Subscription } from 'rxjs';
import { Flow, currentLink, withLink, type DemandLink, type Outlet, type Producer } from '../src/flow/demand.js';
import { Inlet } from '../src/flow/inlet.js';
import { LinkedRun } from '../src/flow/linked-run.js';
import type { ShedReason } from '../src/flow/options.js';
import { Ring } from '../src/flow/ring.js';
import { callHook } from '../src/flow/report.js';
import { StageStats } from '../src/flow/stats.js';
import { activeIntrospector, type InspectedRun, type RunDescription } from '../src/flow/introspection.js';
import { Traced, toTraced } from '../src/core/trace.js';
import { forEachSettlement, giveBack } from '../src/core/settlement.js';
import { UnpausableSourceError } from '../src/core/errors.js';
import type { ShedEvent } from './stage.js';

/** Builds one lane's pipeline from the lane's Flow. Subscribe the Flow once per subscription of the result. */
export type LaneFactory<T, R> = (flow: Flow<Traced<T>>, index: number) => Observable<R>;

/** A fan-out operator: any source of `T` (plain or traced) in, the lanes' merged outputs out. */
export type FanOutOperator<T, R> = (source: Observable<T | Traced<T>>) => Observable<R>;

/** An element shed inside a fan-out operator, and the lane it was meant for. */
export interface LaneShedEvent<T> extends ShedEvent<T> {
  readonly lane: number;
}

/** Settings a run needs once options are parsed. */
export interface LaneConfig<T, R> {
  readonly name: string;
  readonly capacity: number;
  readonly factories: readonly LaneFactory<T, R>[];
  readonly onShed: ((event: LaneShedEvent<T>) => void) | undefined;
  readonly scheduler: SchedulerLike | undefined;
  readonly transitTimeout: number;
}

/** Builds the operator: one run per subscription, started inside the consumer's link scope. */
export function fanOut<T, R, C extends LaneConfig<T, R>>(
  config: C,
  stats: StageStats | undefined,
  createRun: (source: Observable<T | Traced<T>>, config: C, stats: StageStats, subscriber: Subscriber<R>) => LaneRun<T, R>,
): FanOutOperator<T, R> {
  const shared = stats ?? new StageStats();
  return (source) =>
    new Observable<R>((subscriber) => {
      // Read here, synchronously inside subscribe: this is the consumer's link, if any.
      const link = currentLink();
      const run = createRun(source, config, shared, subscriber);
      // Not a Flow, so told here: before its lanes' pipelines start, so they find its node.
      const introspector = activeIntrospector();
      introspector?.runStarted(run, run.ownLink(), link);
      run.start(link);
      return () => {
        run.cancel();
        introspector?.runEnded(run);
      };
    });
}

/** An element on its way through the operator. */
export class Pending<T> {
  constructor(
    readonly element: Traced<T>,
    readonly seq: number,
  ) {}
}

/** An element waiting outside its lane's full buffer. */
export interface Held<T> {
  readonly lane: Lane<T>;
  readonly pending: Pending<T>;
}

/** One lane: its buffer, the consumers of its Flow, and the subscription of its output. */
export class Lane<T> {
  readonly ring = new Ring<Pending<T>>(4);
  /** Outlets of the current subscriptions of the lane's Flow (normally one). */
  readonly outlets: Outlet<Traced<T>>[] = [];
  /** Upstream ended and the lane's buffer is empty: its Flow has completed. */
  finished = false;
  /** The lane's output ended: elements for this lane have no consumer any more. */
  closed = false;
  subscription: Subscription | undefined;
  readonly flow: Flow<Traced<T>>;

  constructor(
    readonly index: number,
    run: LaneRun<T, unknown>,
  ) {
    this.flow = new Flow<Traced<T>>((outlet) => new LaneProducer(this, run, outlet));
  }

  /** True when one of the lane's consumers can take an element now. */
  wanted(): boolean {
    for (let i = 0; i < this.outlets.length; i++) if (this.outlets[i]!.wants()) return true;
    return false;
  }
}

/** A lane's Flow: seen by an inspector as part of its operator, the edge to the lane's pipeline. */
class LaneProducer<T> implements Producer, InspectedRun {
  readonly part = true;
  constructor(
    private readonly lane: Lane<T>,
    private readonly run: LaneRun<T, unknown>,
    private readonly outlet: Outlet<Traced<T>>,
  ) {
    lane.outlets.push(outlet);
  }

  get stats(): StageStats {
    return this.run.stats;
  }

  describe(): RunDescription {
    return this.run.describe();
  }

  demandNow(): number {
    return this.outlet.demand();
  }

  ownLink(): undefined {
    return undefined;
  }

  pull(): void {
    this.run.pull();
  }

  cancel(): void {
    const index = this.lane.outlets.indexOf(this.outlet);
    if (index >= 0) this.lane.outlets.splice(index, 1);
  }
}

/**
 * One subscription of a fan-out operator: the whole state machine. Subclasses decide
 * only routing — where an arriving element goes (`route`), how much upstream may send
 * (`room`), and what to move between buffers once lanes have taken what they want
 * (`settle`). Demand, completion, errors, teardown and accounting live here.
 */
export abstract class LaneRun<T, R> extends LinkedRun<T | Traced<T>> implements InspectedRun {
  protected readonly lanes: Lane<T>[];
  protected readonly inlet: Inlet;
  /** The merged output of the lanes: `LinkedRun` completes it (see `finish`). */
  protected readonly outlet: Subscriber<R>;
  /** Lane copies each upstream element makes (broadcast: one per lane). */
  protected copies = 1;
  /**
   * Elements accepted from upstream whose lane was full, oldest first (partition's
   * head-of-line element; more only as a bounded overshoot). Each waits for a full
   * lane and moves in (`settle`) as soon as that lane has room.
   */
  protected readonly held = new Ring<Held<T>>(2);
  private openOutputs: number;
  private seq = 0;

  constructor(
    protected readonly source: Observable<T | Traced<T>>,
    protected readonly config: LaneConfig<T, R>,
    readonly stats: StageStats,
    private readonly subscriber: Subscriber<R>,
  ) {
    super();
    this.outlet = subscriber;
    this.inlet = new Inlet(this, {
      scheduler: config.scheduler,
      transitTimeout: config.transitTimeout,
      onLate: () => stats.lateArrivals++,
      onGraceGrown: (grace) => {
        stats.transitSlack = Math.max(stats.transitSlack, grace);
      },
    });
    this.lanes = config.factories.map((_, index) => new Lane<T>(index, this as LaneRun<T, unknown>));
    this.openOutputs = this.lanes.length;
  }

  // ---- inspection ----

  /** `balance`, `broadcast` or `partition`, as an inspector labels it. */
  protected abstract readonly kind: string;

  describe(): RunDescription {
    return { name: this.config.name, kind: this.kind, capacity: this.config.capacity * this.lanes.length, concurrency: this.lanes.length, policy: 'pause' };
  }

  /** Its lanes' Flows report their consumers' demand. */
  demandNow(): number {
    return 0;
  }

  ownLink(): DemandLink {
    return this.inlet;
  }

  // ---- routing, decided by each operator ----

  /** Elements upstream may send now without breaking the bound. */
  abstract override room(): number;
  /** Places an arriving element (already counted as received). `asked`: it came on demand. */
  protected abstract route(pending: Pending<T>, asked: boolean): void;
  /** Moves elements between buffers after lanes took what they wanted; returns whether anything moved. */
  protected settle(): boolean {
    return false;
  }

  // ---- lifecycle ----

  /** Subscribes every lane's output inside `link` (the consumer's link scope), then upstream. */
  override start(link?: DemandLink): void {
    for (const lane of this.lanes) {
      let output: Observable<R>;
      try {
        output = this.config.factories[lane.index]!(lane.flow, lane.index);
      } catch (err) {
        this.fail(err);
        return;
      }
      const subscription = withLink(link, () =>
        output.subscribe({
          next: (value) => {
            if (!this.terminated) this.subscriber.next(value);
          },
          error: (err: unknown) => this.fail(err),
          complete: () => this.outputDone(lane),
        }),
      );
      if (this.terminated) {
        subscription.unsubscribe();
        return;
      }
      if (!lane.closed) lane.subscription = subscription;
    }
    super.start();
  }

  /** The consumer unsubscribed: everything still held is shed as `cancelled`. */
  protected override onCancel(): void {
    this.shedAll('cancelled');
  }

  // ---- upstream signals ----

  onNext(input: T | Traced<T>): void {
    if (this.terminated || this.upstreamDone) {
      if (input instanceof Traced) giveBack(input.value, input.trace.settlement); // §2.8: late elements after cancel are not taken
      return;
    }
    // A consumer that left inside a synchronous subscribe (`take`) has no teardown registered yet.
    if (this.subscriber.closed) {
      if (input instanceof Traced) giveBack(input.value, input.trace.settlement);
      this.cancel();
      return;
    }
    const asked = this.inlet.arrive();
    const seq = this.seq++;
    const element = toTraced(input, seq, false);
    this.stats.receivedCount += this.copies;
    const settlement = element.trace.settlement;
    if (settlement !== undefined) for (let copy = 1; copy < this.copies; copy++) settlement.hold();
    this.route(new Pending(element, seq), asked);
    this.drain();
  }

  onUpstreamError(err: unknown): void {
    this.fail(err);
  }

  // ---- buffers, used by routing ----

  /** Puts an element into a lane's buffer, or sheds it when the lane's output has ended. */
  protected enqueue(lane: Lane<T>, pending: Pending<T>): void {
    if (lane.closed) {
      this.shed(lane, pending, 'cancelled');
      return;
    }
    lane.ring.push(pending);
    this.stats.buffered++;
  }

  /** Sheds the oldest element buffered for `lane`. */
  protected shedOldest(lane: Lane<T>, reason: ShedReason): void {
    const pending = lane.ring.shift();
    if (pending === undefined) return;
    this.stats.buffered--;
    this.shed(lane, pending, reason);
  }

  protected shed(lane: Lane<T>, pending: Pending<T>, reason: ShedReason): void {
    this.stats.shed[reason]++;
    const trace = pending.element.trace;
    if (trace.sampled) trace.keep(this.config.name, 0, 0, 0, 0, 0, reason); // as a stage does: a dead letter says where and why
    forEachSettlement(pending.element.value, trace.settlement, (settlement) => settlement.shed(reason));
    callHook(this.config.onShed, {
      stage: this.config.name,
      reason,
      value: pending.element.value,
      seq: pending.seq,
      trace: pending.element.trace,
      count: 1,
      lane: lane.index,
    });
  }

  /** An element arrived that upstream was not asked for while there was no room: the source cannot be paused. */
  protected unpausable(): void {
    this.stats.failed += this.copies;
    this.fail(new UnpausableSourceError(this.config.name, this.config.capacity));
  }

  // ---- the drain loop ----

  /** One pass of `LinkedRun.drain`: hands lanes what their consumers want, settles, and completes drained lanes once upstream is done. */
  protected deliver(): void {
    let progressed = true;
    while (progressed && !this.terminated) {
      progressed = false;
      for (const lane of this.lanes) if (this.deliverTo(lane)) progressed = true;
      if (!this.terminated && this.settle()) progressed = true;
    }
    if (this.terminated || !this.upstreamDone) return;
    for (const lane of this.lanes) {
      if (this.terminated) break;
      // A held element may be bound for a lane with an empty buffer (it waits behind the head of the line).
      if (lane.ring.length === 0 && !this.holdsFor(lane)) this.finishLane(lane);
    }
  }

  /** Always: the run ends when its last lane output ends (`outputDone`), not when the drain runs dry. */
  protected holding(): boolean {
    return true;
  }

  protected override onPause(): void {
    this.stats.pauses++;
  }

  private holdsFor(lane: Lane<T>): boolean {
    for (let i = 0; i < this.held.length; i++) if (this.held.at(i)!.lane === lane) return true;
    return false;
  }

  private deliverTo(lane: Lane<T>): boolean {
    let progressed = false;
    const outlets = lane.outlets;
    for (let i = 0; i < outlets.length && lane.ring.length > 0 && !this.terminated; i++) {
      const outlet = outlets[i]!;
      while (lane.ring.length > 0 && !this.terminated && outlet.wants()) {
        const pending = lane.ring.shift()!;
        this.stats.buffered--;
        this.stats.deliveredCount++;
        this.stats.emittedCount++;
        outlet.next(pending.element);
        progressed = true;
      }
    }
    return progressed;
  }

  private finishLane(lane: Lane<T>): void {
    lane.finished = true;
    // Completing an outlet removes it from `outlets`; a later subscriber is completed by its first pull.
    for (const outlet of lane.outlets.slice()) outlet.complete();
  }

  // ---- ending ----

  /** A lane's output ended: its buffer has no consumer any more; the output ends with the last lane. */
  private outputDone(lane: Lane<T>): void {
    if (this.terminated || lane.closed) return;
    lane.closed = true;
    lane.subscription = undefined;
    while (lane.ring.length > 0) this.shedOldest(lane, 'cancelled');
    if (--this.openOutputs > 0) {
      this.drain();
      return;
    }
    this.terminated = true;
    this.shedAll('cancelled');
    this.release();
    this.subscriber.complete();
  }

  /** Ends the output with `error`; what is still held counts as failed. */
  protected fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    let lost = 0;
    // What is held when the run fails: its sources may offer it again.
    for (const lane of this.lanes) {
      lost += lane.ring.length;
      this.stats.buffered -= lane.ring.length;
      for (const pending of lane.ring.drain()) giveBack(pending.element.value, pending.element.trace.settlement);
    }
    lost += this.held.length;
    this.stats.buffered -= this.held.length;
    for (const { pending } of this.held.drain()) giveBack(pending.element.value, pending.element.trace.settlement);
    this.stats.failed += lost;
    this.release();
    this.subscriber.error(error);
  }

  private shedAll(reason: ShedReason): void {
    for (const lane of this.lanes) while (lane.ring.length > 0) this.shedOldest(lane, reason);
    for (const { lane, pending } of this.held.drain()) {
      this.stats.buffered--;
      this.shed(lane, pending, reason);
    }
  }

  protected release(): void {
    this.upstream?.unsubscribe();
    this.upstream = undefined;
    this.inlet.close();
    for (const lane of this.lanes) {
      const subscription = lane.subscription;
      lane.subscription = undefined;
      subscription?.unsubscribe();
    }
  }
}
