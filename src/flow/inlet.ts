import { asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import type { DemandLink, Resumable } from './protocol.js';
import { Ring } from './ring.js';

/** What an inlet asks of the consumer that owns it. */
export interface RoomOwner {
  /** Elements the consumer can take right now without breaking its bound. */
  room(): number;
}

export interface InletOptions {
  /** Timers of the in-transit wait. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
  /**
   * The longest the link waits for an element that may have been dropped (ms): before it
   * has seen a deferral, and as the cap of its give-up time after. Default 1000.
   */
  transitTimeout?: number;
  /**
   * Elements that may go missing beyond the room before a deferral has been seen, at
   * first. Default 16; 0 for a consumer that must never get more than it asked for.
   */
  grace?: number;
  /** Called for each element given up on that arrives after all. */
  onLate?: () => void;
  /** Called with the new grace when a wait ended with nothing arrived before any deferral was seen (the slack grew). */
  onGraceGrown?: (grace: number) => void;
}

/** Unconfirmed elements a link lets out beyond its room before it has seen a deferral, at first (by default). */
const FIRST_GRACE = 16;
/** Each wave that ends with nothing arrived multiplies the grace by this: a long drop run costs a few waves, not one per run. */
const GRACE_GROWTH = 4;
const MAX_GRACE = 1 << 20;
/** Elements given up on that are remembered as asked for (at least; more while the grace is larger). */
const MIN_FORGIVEN = 1024;
/** Transit times kept: the give-up time follows the longest of the recent ones. */
const SAMPLES = 8;
/** Until `SAMPLES` transits (or silences, see `giveUp`) have been timed, the give-up multiple is this many times larger. */
const WARM_UP = 4;
/** A clock that reads whole units (`Date.now()`) reads a transit just under one unit as 0: every wait is one unit longer than its reading. */
const TICK = 1;
/** The shortest give-up wait: two ticks, so a wait never ends in the tick a one-tick deferral is due. */
const MIN_WAIT = 2 * TICK;
/** The give-up time starts at this multiple of the observed transit time, and doubles for each element that came back after it. */
const FIRST_FACTOR = 2;
const MAX_FACTOR = 64;

/**
 * Placeholders for the in-transit bookkeeping until an element goes in transit: most links (a
 * server's per-request consumer, a stage linked straight to its producer) never need it, so
 * none pays for empty maps and rings. Shared, so only read:
 * every write site swaps in an inlet's own first (`ownMissing`, `ownSent`, `ownGiven`, `sample`).
 */
const NO_MISSING: ReadonlyMap<Resumable, number> = new Map();
const NO_TIMES = new Ring<number>(2);
const NO_SAMPLES: readonly number[] = Object.freeze([]);

/** Stands for producers that do not say who they are when they emit. */
const ANONYMOUS: Resumable = { resume: () => {} };
/** Holds the in-transit elements of producers that have gone (an inner Flow that completed): they count against every producer. */
const GONE: Resumable = { resume: () => {} };

/**
 * The upstream-facing side of a consumer: the `DemandLink` its producers ask before
 * every element. One inlet may have several producers (a `merge` of Flows, or the
 * inner Flows of a `mergeMap`).
 *
 * An element emitted upstream that does not arrive during its emit was either dropped
 * (`filter`) or is held by a plain operator (`delay`, `observeOn`, `mergeMap` over
 * Promises, `concatMap`'s queue); only time tells the two apart. Such elements are
 * *in transit* and count against the consumer's room for the producer that emitted
 * them while it is subscribed (another producer, such as the inner Flow that drains
 * a `concatMap`'s queue, is not held back by them), and for every producer once it
 * has gone; so a holding segment stays bounded: by the room, per live producer. The
 * evidence that settles them:
 *
 * - a producer's element arriving *during* its emit: that producer's path is
 *   synchronous, what it lost before was dropped and what it loses later will be
 *   (no demand leaks through a `filter`). Only that producer's: another's may be held;
 * - an element arriving *outside* any emit: a deferral. From then on no path counts
 *   as synchronous, every missing element stays in transit, and each arrival settles
 *   the oldest one and measures its transit time;
 * - a Flow subscribed because of an element (`mergeMap`'s inner Flow during the emit,
 *   `concatMap`'s next inner later): the element became a producer that itself asks
 *   before each element, so it is no longer in transit (and a later one shows the
 *   segment holds elements);
 * - time. A consumer held back only by in-transit elements waits for them; any
 *   arrival ends the wait. Before the segment has shown holding, it waits until the
 *   oldest has been missing `transitTimeout`, then takes them all as dropped. Once it
 *   has, it gives up on every element in transit, all at once, when the segment has
 *   been silent — no element in, none out — for twice the longest of the last 8 transit
 *   times plus a clock tick (eight times while it has timed fewer; at most
 *   `transitTimeout`): a segment whose elements keep arriving is a queue, not a filter,
 *   and giving up on all leaves no dropped element behind to be taken for a slow one.
 *   Each silence waited out ages the transit times kept (the shortest is written over
 *   the oldest), so one slow transit does not set the wait for good. A wait that fires
 *   gives the segment one more turn before it gives up: timers that came due with it (a
 *   held-up event loop fires them together) may run after it.
 *   An element that comes back after it was given up on (`onLate`) is taken, and the
 *   link never again gives up sooner than twice its transit time.
 *
 * - probes between the segment's plain operators (`probeSegment`): `dropped` for an element
 *   an operator shown synchronous gave nothing for, settled as an arrival would be; `moved`
 *   for an element going from one operator to the next, so a queue draining into a filter
 *   is not a silence.
 *
 * Before a segment has shown holding, up to `grace` elements (16 by default) may go
 * missing beyond the room without a wait, so a filter dropping a short run before its
 * first pass never waits. That is the slack of a deferring segment: `grace` more than
 * its room while its first element comes back within `transitTimeout`. Each wait that
 * ends with nothing arrived multiplies the grace by 4, so a filter dropping a long run
 * before its first pass costs a few `transitTimeout`s, once (a deferral longer than
 * `transitTimeout` costs the same factor of slack per `transitTimeout`).
 *
 * Invariant: `inTransit` equals the sum of the per-producer missing counts and the
 * length of `sent`, and never exceeds the elements emitted that have neither arrived nor
 * become producers.
 */
export class Inlet implements DemandLink {
  /** Replaced by a one-element array on the first attach: a push onto `[]` allocates room for 16. */
  private outlets: Resumable[] = [];
  private readonly scheduler: SchedulerLike;
  private readonly transitTimeout: number;
  private emitting = 0;
  /** Arrivals and producers attached during an emit, counted in order: an emit's token is this count before it. */
  private events = 0;
  /** `events` at the last arrival, and at the last producer attached during an emit. */
  private lastArrival = 0;
  private lastAttach = 0;
  /** An element arrived outside any emit. */
  private deferredSeen = false;
  /** An element arrived late, or became a producer late: missing elements are held, not dropped, until shown otherwise. */
  private holds = false;
  private starved = false;
  /** Unconfirmed elements let out beyond the room while the segment has shown no holding. */
  private grace: number;
  /** Elements given up on that may still arrive: they were asked for. */
  private forgiven = 0;
  /** Per producer: its elements in transit (`NO_MISSING` until the first). */
  private missing: ReadonlyMap<Resumable, number> = NO_MISSING;
  /**
   * Producers whose elements have come through during their emit: what they lose is dropped. The
   * first is kept in `synchronousOne` (the usual case, one producer), the others in a Set made for them.
   */
  private synchronousOne: Resumable | undefined;
  private synchronousMore: Set<Resumable> | undefined;
  /** When each in-transit element was emitted, oldest first (which element arrives is not known: the oldest is settled). */
  private sent: Ring<number> = NO_TIMES;
  /** When the elements given up on after a deferral was seen were emitted, oldest first (at most `forgiven`). */
  private given: Ring<number> = NO_TIMES;
  /** Recent transit times (ms), and the next slot to write. */
  private samples: readonly number[] = NO_SAMPLES;
  private nextSample = 0;
  private factor = FIRST_FACTOR;
  /** The longest transit of an element that came back after it was given up on: never give up sooner than twice that. */
  private slowest = 0;
  /** When the last element arrived outside an emit. */
  private lastArrivalAt = 0;
  /** When a probe last saw an element move between the segment's operators outside an emit (see `probeSegment`). */
  private lastMoveAt = 0;
  private wait: Subscription | undefined;
  private readonly onLate: (() => void) | undefined;
  private readonly onGraceGrown: ((grace: number) => void) | undefined;
  /** Elements emitted upstream that have not arrived (held by a plain operator, or dropped). */
  inTransit = 0;

  constructor(
    private readonly owner: RoomOwner,
    options: InletOptions = {},
  ) {
    this.scheduler = options.scheduler ?? asyncScheduler;
    this.transitTimeout = options.transitTimeout ?? 1000;
    this.grace = options.grace ?? FIRST_GRACE;
    this.onLate = options.onLate;
    this.onGraceGrown = options.onGraceGrown;
  }

  get producers(): number {
    return this.outlets.length;
  }

  /** Asked by `outlet` before each element: its own elements in transit count against the room, not other producers'. */
  wants(outlet: Resumable = ANONYMOUS): boolean {
    const room = this.owner.room();
    // Asked before every element (kept small: see the rules atop stage/run.ts): with nothing in transit only the room counts.
    if (this.inTransit === 0 ? room > 0 : room - this.unconfirmed(outlet) > 0) return true;
    return this.starve(room, outlet);
  }

  /** No demand for `outlet` now: resume it when room comes back, or when its in-transit elements are given up on. */
  private starve(room: number, outlet: Resumable): false {
    this.starved = true;
    if (room > 0) this.waitForTransit(outlet);
    return false;
  }

  demand(outlet: Resumable = ANONYMOUS): number {
    return Math.max(0, this.owner.room() - this.unconfirmed(outlet));
  }

  /** The whole room, to the only producer (a second producer would share it: see `attach`). */
  credit(outlet: Resumable): number {
    return this.outlets.length === 1 && this.outlets[0] === outlet ? this.demand(outlet) : 0;
  }

  beforeEmit(): number {
    this.emitting++;
    return this.events;
  }

  afterEmit(token: number, outlet: Resumable = ANONYMOUS): void {
    this.emitting--;
    if (this.events === token) {
      // Nothing arrived and no Flow was subscribed for it: dropped, or held.
      if (this.isSynchronous(outlet)) return;
      this.inTransit++;
      const missing = this.ownMissing();
      missing.set(outlet, (missing.get(outlet) ?? 0) + 1);
      this.ownSent().push(this.scheduler.now());
      return;
    }
    // It came through during its emit (not as a new producer): this producer's path is synchronous.
    if (this.lastArrival > token && this.lastAttach <= token && !this.deferredSeen && outlet !== ANONYMOUS) {
      if (this.synchronousOne !== outlet) this.addSynchronous(outlet);
      const dropped = this.missing.get(outlet);
      if (dropped !== undefined) {
        this.ownMissing().delete(outlet);
        this.inTransit -= dropped;
        this.dropSent(dropped);
        this.remember(dropped);
      }
    }
  }

  /**
   * The consumer calls this for every element it receives. Returns whether the
   * element was asked for (arrived inside a producer's emit, was in transit, or was
   * given up on while held): an element that was not came from a source that cannot
   * be paused.
   */
  arrive(): boolean {
    this.lastArrival = ++this.events;
    if (this.wait !== undefined) this.stopWaiting();
    if (this.emitting > 0) return true;
    this.lastArrivalAt = this.scheduler.now();
    // Outside any emit: a deferral (or a source that cannot be paused).
    if (this.inTransit > 0 || this.forgiven > 0 || this.outlets.length > 0) this.deferring();
    if (this.inTransit > 0) {
      const sent = this.settle(1);
      if (sent !== undefined) this.sample(this.scheduler.now() - sent);
      return true;
    }
    if (this.forgiven > 0) {
      this.forgiven--;
      // Given up on, yet it came: the give-up time was too short. Its transit (if known) is a sample, the longest yet.
      const sent = this.given.shift();
      if (sent !== undefined) this.slowest = Math.max(this.slowest, this.lastArrivalAt - sent);
      else this.factor = Math.min(MAX_FACTOR, this.factor * 2);
      this.onLate?.();
      return true;
    }
    return false;
  }

  /**
   * A probe between the plain operators of the segment saw one drop an element (`probeSegment`):
   * outside an emit that is an element of the segment accounted for, as an arrival would be, and the
   * segment is not silent. During an emit the element being emitted is left to `afterEmit`.
   */
  dropped(): void {
    if (this.emitting > 0) return;
    if (this.wait !== undefined) this.stopWaiting();
    const now = this.scheduler.now();
    this.lastArrivalAt = now;
    this.lastMoveAt = now;
    // Not a transit sample: a drop partway along is quicker than what goes the whole way.
    if (this.inTransit > 0) this.settle(1);
    else if (this.forgiven > 0) {
      this.forgiven--;
      this.given.shift();
    }
    this.signal();
  }

  /** A probe saw an element move from one operator of the segment to the next: the segment is not silent. */
  moved(): void {
    if (this.emitting === 0 && this.inTransit > 0) this.lastMoveAt = this.scheduler.now();
  }

  /** A producer asked and was told no: `signal` has someone to resume. */
  get starving(): boolean {
    return this.starved;
  }

  /** Room came back: resume producers that stopped for lack of demand. */
  signal(): void {
    if (this.starved === true) this.resumeProducers();
  }

  private resumeProducers(): void {
    this.starved = false;
    const outlets = this.outlets;
    // A resumed producer may detach (it ended): iterate a copy, unless there is only the one.
    if (outlets.length === 1) outlets[0]!.resume();
    else for (const outlet of outlets.slice()) outlet.resume();
  }

  attach(outlet: Resumable): void {
    if (this.outlets.length === 1) this.outlets[0]!.revoke?.();
    if (this.outlets.length === 0) this.outlets = [outlet];
    else this.outlets.push(outlet);
    if (this.emitting > 0) {
      this.lastAttach = ++this.events; // an emit turned its element into this producer (mergeMap's inner Flow)
    } else if (this.inTransit > 0) {
      this.settle(1); // a held element became this producer (concatMap's next inner)
      this.holds = true;
    }
  }

  detach(outlet: Resumable): void {
    const index = this.outlets.indexOf(outlet);
    if (index >= 0) this.outlets.splice(index, 1);
    if (this.synchronousOne === outlet) this.synchronousOne = undefined;
    this.synchronousMore?.delete(outlet);
    const missing = this.missing.get(outlet);
    if (missing !== undefined) {
      const own = this.ownMissing();
      own.delete(outlet);
      own.set(GONE, (own.get(GONE) ?? 0) + missing);
    }
    if (this.outlets.length === 0) this.stopWaiting();
  }

  /** The consumer is done: no more waiting for in-transit elements. */
  close(): void {
    this.stopWaiting();
  }

  /**
   * `count` in-transit elements are accounted for: `first`'s if it has any, then gone
   * producers', then any producer's. Returns when the oldest of them was emitted.
   */
  private settle(count: number, first?: Resumable): number | undefined {
    this.inTransit -= count;
    const oldest = this.sent.peek();
    this.dropSent(count);
    if (first !== undefined) count = this.take(first, count);
    count = this.take(GONE, count);
    for (const outlet of this.missing.keys()) {
      if (count === 0) break;
      count = this.take(outlet, count);
    }
    return oldest;
  }

  /** Takes up to `count` from `outlet`'s missing elements; returns how many are left to take. */
  private take(outlet: Resumable, count: number): number {
    const missing = this.missing.get(outlet);
    if (missing === undefined || count === 0) return count;
    const taken = Math.min(missing, count);
    if (taken === missing) this.ownMissing().delete(outlet);
    else this.ownMissing().set(outlet, missing - taken);
    return count - taken;
  }

  private dropSent(count: number): void {
    for (let i = 0; i < count && this.sent.length > 0; i++) this.sent.dropFirst();
  }

  /** Forgiven elements are remembered (bounded: most were dropped, and a plain source must not ride on them). */
  private remember(count: number): void {
    this.forgiven = Math.min(Math.max(MIN_FORGIVEN, this.grace), this.forgiven + count);
    while (this.given.length > this.forgiven) this.given.dropFirst();
  }

  private longest(): number {
    let longest = 0;
    for (const transit of this.samples) if (transit > longest) longest = transit;
    return longest;
  }

  private shortest(): number {
    let shortest = Number.POSITIVE_INFINITY;
    for (const transit of this.samples) if (transit < shortest) shortest = transit;
    return shortest;
  }

  private sample(transit: number): void {
    if (this.samples === NO_SAMPLES) this.samples = [];
    const samples = this.samples as number[];
    if (samples.length < SAMPLES) samples.push(transit);
    else samples[this.nextSample] = transit;
    this.nextSample = (this.nextSample + 1) % SAMPLES;
  }

  /** How long the segment may be silent before its missing elements are given up on: a multiple of the longest recent transit time. */
  private giveUpAfter(): number {
    if (!this.holds || this.samples.length === 0) return this.transitTimeout;
    // The first transits seen are the quickest (the slow ones have not come yet): be slower to give up until there are enough.
    const factor = this.samples.length < SAMPLES ? this.factor * WARM_UP : this.factor;
    return Math.min(this.transitTimeout, Math.max(MIN_WAIT, this.longest() * factor + TICK, this.slowest * FIRST_FACTOR + TICK));
  }

  private deferring(): void {
    if (this.deferredSeen) return;
    this.deferredSeen = true;
    this.holds = true;
    this.synchronousOne = undefined;
    this.synchronousMore = undefined;
  }

  private isSynchronous(outlet: Resumable): boolean {
    return this.synchronousOne === outlet || this.synchronousMore?.has(outlet) === true;
  }

  private addSynchronous(outlet: Resumable): void {
    if (this.isSynchronous(outlet)) return;
    if (this.synchronousOne === undefined) this.synchronousOne = outlet;
    else (this.synchronousMore ??= new Set()).add(outlet);
  }

  /** This inlet's own map of missing elements, made on the first write. */
  private ownMissing(): Map<Resumable, number> {
    if (this.missing === NO_MISSING) this.missing = new Map();
    return this.missing as Map<Resumable, number>;
  }

  private ownSent(): Ring<number> {
    if (this.sent === NO_TIMES) this.sent = new Ring<number>(16);
    return this.sent;
  }

  private ownGiven(): Ring<number> {
    if (this.given === NO_TIMES) this.given = new Ring<number>(16);
    return this.given;
  }

  private unconfirmed(outlet: Resumable): number {
    if (this.inTransit === 0) return 0;
    const missing = (this.missing.get(outlet) ?? 0) + (this.missing.get(GONE) ?? 0);
    return this.holds ? missing : Math.max(0, missing - this.grace);
  }

  /** Only in-transit elements hold demand back: wait for them, then give up on them so the link cannot stall. */
  private waitForTransit(outlet: Resumable): void {
    if (this.wait !== undefined || this.inTransit === 0 || this.outlets.length === 0) return;
    // Before holding was shown, the oldest is waited for; after, a silence of the whole segment.
    const due = Math.max(this.holds ? this.lastActivity() : (this.sent.peek() ?? this.scheduler.now()), this.lastMoveAt) + this.giveUpAfter();
    this.schedule(outlet, due);
  }

  /** Gives up at `due`, after one more turn once the segment has shown holding (`lastTurn`). */
  private schedule(outlet: Resumable, due: number, lastTurn = false): void {
    this.wait = this.scheduler.schedule(
      () => {
        this.wait = undefined;
        // Timers due with this one may run after it (a held-up event loop fires them together): give them their turn first.
        if (!lastTurn && this.holds) return this.schedule(outlet, due, true);
        this.giveUp(outlet);
        this.starved = true;
        this.signal();
      },
      lastTurn ? 0 : Math.max(0, due - this.scheduler.now()),
    );
  }

  /** The last sign of the segment moving: an element arriving from it, or one going into it. */
  private lastActivity(): number {
    const sent = this.sent.length;
    const moved = Math.max(this.lastArrivalAt, this.lastMoveAt);
    return sent === 0 ? moved : Math.max(moved, this.sent.at(sent - 1)!);
  }

  /**
   * Nothing arrived while waiting. Before holding was shown, all in transit were dropped. After, once
   * the segment has been silent — nothing in, nothing out — for the give-up time, every element in it
   * has been missing that long: all are given up on at once, so none lingers to skew a later transit.
   */
  private giveUp(outlet: Resumable): void {
    if (this.inTransit === 0) return;
    // Still moving between the segment's operators (a queue draining into a filter): not given up on yet.
    if (this.scheduler.now() - this.lastMoveAt < this.giveUpAfter()) return;
    if (!this.holds) {
      // Before any holding was shown: they were dropped; let out more before the next wait.
      this.remember(this.inTransit);
      this.inTransit = 0;
      this.ownMissing().clear();
      this.ownSent().clear();
      this.grace = Math.min(MAX_GRACE, Math.max(1, this.grace * GRACE_GROWTH));
      this.onGraceGrown?.(this.grace);
      return;
    }
    if (this.scheduler.now() - this.lastActivity() < this.giveUpAfter()) return; // not silent long enough: the next wait decides
    const count = this.inTransit;
    // A silence waited out times nothing new, but ages the ring: one slow transit must not set the wait for good.
    if (this.samples.length > 0) this.sample(this.shortest());
    for (let i = 0; i < this.sent.length; i++) this.ownGiven().push(this.sent.at(i)!);
    this.settle(count, outlet);
    this.remember(count);
  }

  private stopWaiting(): void {
    const wait = this.wait;
    if (wait === undefined) return;
    this.wait = undefined;
    wait.unsubscribe();
  }
}
