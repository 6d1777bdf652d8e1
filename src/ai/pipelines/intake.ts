/**
 * The door of a server's shared pipelines: one bounded queue, by priority class, that every
 * transport's requests enter before any stage. Each served model's pipeline pulls its own
 * requests from it as its first stage has room; when the queue is full the lowest class goes
 * first (the arriving request, or the newest waiting one of a lower class), refused at once
 * with a `retryAfter` computed from how fast the queue has been draining.
 */
import { asyncScheduler, type SchedulerLike } from 'rxjs';
import { AdmissionRejectedError, SluiceError } from '../../core/errors.js';
import { lazySchema } from '../../core/zod.js';
import { Traced, type TraceContext } from '../../core/trace.js';
import { Flow, type Outlet, type Producer } from '../../flow/demand.js';
import type { InspectedRun, RunDescription } from '../../flow/introspection.js';
import type { DemandLink } from '../../flow/protocol.js';
import { parseOptions, schedulerSchema } from '../../flow/options.js';
import { StageStats } from '../../flow/stats.js';
import { PRIORITY_CLASSES, type PriorityClass } from '../../core/vocabulary.js';

export { PRIORITY_CLASSES, type PriorityClass };

/** Options of `Intake`. */
export interface IntakeOptions {
  /** Names it in errors, metrics and the inspector. Default `intake`. */
  readonly name?: string;
  /** Requests that may wait, across every pipeline and class. */
  readonly maxQueue: number;
  /** Counters (`received`, `delivered`, `shed` by reason, `buffered`). */
  readonly stats?: StageStats;
  /** The clock of the drain rate. Default `asyncScheduler`. */
  readonly scheduler?: SchedulerLike;
  /** Each tenant's class when its request names none. Default `default` for all. */
  readonly tenants?: Readonly<Record<string, PriorityClass>>;
  /**
   * The longest a request should wait, ms: the queue holds no more than drains in that time at the
   * rate it drained while requests waited, and the lowest class goes first past it. A request then
   * starts soon or is refused at once. Default: no bound but `maxQueue`.
   */
  readonly maxWait?: number;
}

const optionsSchema = lazySchema((z) =>
  z.strictObject({
    name: z.string({ error: 'name must be a string' }).min(1, { error: 'name must not be empty' }).default('intake'),
    maxQueue: z.number({ error: 'maxQueue must be a number' }).int({ error: 'maxQueue must be an integer' }).min(0, { error: 'maxQueue must be ≥ 0' }),
    stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
    scheduler: schedulerSchema().optional(),
    tenants: z.record(z.string(), z.enum(PRIORITY_CLASSES, { error: `a tenant's class must be one of ${PRIORITY_CLASSES.join(', ')}` })).optional(),
    maxWait: z.number({ error: 'maxWait must be a number' }).positive({ error: 'maxWait must be > 0' }).optional(),
  }),
);

/** A request offered to the intake. */
export interface IntakeEntry<J> {
  readonly job: J;
  readonly tenant: string;
  /** Its class; default the tenant's (`tenants`), else `default`. */
  readonly priority?: PriorityClass | undefined;
  readonly trace: TraceContext;
  /** Told when the request is turned away (queue full, evicted, draining): answer it with `err`. */
  readonly refuse: (err: SluiceError) => void;
}

interface Waiting<J> extends IntakeEntry<J> {
  readonly rank: number;
  readonly seq: number;
  readonly lane: Lane<J>;
  readonly arrivedAt: number;
}

/** Departures remembered for the drain rate. */
const RATE_WINDOW = 64;

/** The shared queue; `lane(name)` is one pipeline's source. */
export class Intake {
  readonly name: string;
  readonly maxQueue: number;
  readonly stats: StageStats;
  private readonly scheduler: SchedulerLike;
  private readonly tenants: Readonly<Record<string, PriorityClass>>;
  private readonly lanes = new Map<string, Lane<unknown>>();
  private waitingCount = 0;
  private seq = 0;
  private draining = false;
  /** When the last `RATE_WINDOW` requests left, oldest first (a ring). */
  private readonly departures: number[] = [];
  private departed = 0;
  private readonly maxWait: number | undefined;
  /** When the last `RATE_WINDOW` requests that had waited left (a ring): the rate the queue drains at while busy. */
  private readonly busyDepartures: number[] = [];
  private busyDeparted = 0;

  /** Bad options throw `InvalidOptionsError` naming the field. */
  constructor(options: IntakeOptions) {
    const config = parseOptions(optionsSchema(), options, 'Intake options');
    this.name = config.name;
    this.maxQueue = config.maxQueue;
    this.stats = config.stats ?? new StageStats();
    this.scheduler = config.scheduler ?? asyncScheduler;
    this.tenants = config.tenants ?? {};
    this.maxWait = config.maxWait;
  }

  /** Requests waiting now, in every lane. */
  get waiting(): number {
    return this.waitingCount;
  }

  /** The source of one pipeline: its requests, highest class first, as its first stage wants them. */
  lane<J>(name: string): Flow<Traced<J>> {
    let lane = this.lanes.get(name) as Lane<J> | undefined;
    if (lane === undefined) {
      lane = new Lane<J>(this, name);
      this.lanes.set(name, lane as Lane<unknown>);
    }
    const chosen = lane;
    return new Flow<Traced<J>>((outlet) => chosen.bind(outlet));
  }

  /**
   * Holds `lane`'s requests at the door while `ready()` is false, whatever its first stage asks:
   * a pipeline whose stage would only buffer a request until a slot frees takes one when it can
   * start it, so every wait happens here, in class order and bounded by `maxWait`. Call
   * `wake(lane)` when `ready()` may have turned true.
   */
  gate(lane: string, ready: () => boolean): void {
    this.laneOf(lane).ready = ready;
  }

  /** Hands `lane`'s pipeline what it wants now: after its `gate` opened. */
  wake(lane: string): void {
    this.laneOf(lane).serve();
  }

  private laneOf(name: string): Lane<unknown> {
    const lane = this.lanes.get(name);
    if (lane === undefined) throw new TypeError(`intake "${this.name}" has no lane "${name}"`);
    return lane;
  }

  /**
   * Queues `entry` for the pipeline `lane`; when the queue is over its bound, the newest request
   * of the lowest class waiting is refused (`ADMISSION_REJECTED`, maybe this one). Returns the
   * function that withdraws it (a client that left), a no-op once it left the queue.
   */
  offer<J>(lane: string, entry: IntakeEntry<J>): () => void {
    const target = this.lanes.get(lane) as Lane<J> | undefined;
    if (target === undefined) throw new TypeError(`intake "${this.name}" has no lane "${lane}"`);
    this.stats.receivedCount++;
    if (this.draining) {
      this.stats.shed['buffer-full']++;
      entry.refuse(new SluiceError('SHUTDOWN', 'The server is shutting down; retry on another instance.'));
      return () => {};
    }
    const waiting: Waiting<J> = {
      ...entry,
      rank: this.rankOf(entry.tenant, entry.priority),
      seq: this.seq++,
      lane: target,
      arrivedAt: this.scheduler.now(),
    };
    target.insert(waiting);
    this.waitingCount++;
    this.stats.buffered++;
    target.serve();
    const bound = this.bound();
    while (this.waitingCount > bound) this.shedLowest(waiting);
    return () => {
      if (!target.remove(waiting)) return;
      this.left();
      this.stats.shed.cancelled++;
    };
  }

  /**
   * Refuses, without queueing it, a request for `lane` that `offer` would refuse: its pipeline runs
   * without demand, the queue is at its bound, and nothing waiting is of a lower class. Counts it
   * shed (`buffer-full`) and returns the retry-after, ms; undefined when it may enter, when there
   * is no such lane, or while draining (`offer` answers those). A transport calls it before it
   * parses a request, so a refusal costs little.
   */
  turnAway(lane: string, tenant: string, priority?: PriorityClass): number | undefined {
    const target = this.lanes.get(lane);
    if (target === undefined || this.draining || this.waitingCount < this.bound() || target.mightTake()) return undefined;
    const rank = this.rankOf(tenant, priority);
    for (const other of this.lanes.values()) {
      const lowest = other.last();
      if (lowest !== undefined && lowest.rank < rank) return undefined;
    }
    this.stats.receivedCount++;
    this.stats.shed['buffer-full']++;
    return this.retryAfter();
  }

  /**
   * Counts a request a transport refused before offering it because its process is behind
   * (`lagging`: its event loop late), and returns the retry-after, ms, as for a full queue.
   */
  turnAwayLagging(): number {
    this.stats.receivedCount++;
    this.stats.shed.lagging++;
    return this.retryAfter();
  }

  /** From now on every request is refused with `SHUTDOWN` (503); those waiting still go through. */
  drain(): void {
    this.draining = true;
  }

  /** How long, ms, a request refused now should wait: the queue ahead of it at the recent drain rate, 1 s to 60 s. */
  retryAfter(ahead = this.waitingCount): number {
    const now = this.scheduler.now();
    const n = this.departures.length;
    if (n < 2) return 1000;
    const oldest = this.departed >= RATE_WINDOW ? this.departures[this.departed % RATE_WINDOW]! : this.departures[0]!;
    const perMs = (n - 1) / Math.max(1, now - oldest);
    return Math.min(60_000, Math.max(1000, Math.ceil((ahead + 1) / perMs)));
  }

  /**
   * Requests that may wait now: `maxQueue`, or fewer when `maxWait` bounds what drains in time (at
   * the rate requests that waited left, else the rate all left); none more once a request has
   * waited `maxWait` already (the queue drains slower than that).
   */
  private bound(): number {
    if (this.maxWait === undefined) return this.maxQueue;
    if (this.longestWait() >= this.maxWait) return Math.min(this.maxQueue, this.waitingCount - 1);
    const busy = this.busyDepartures.length >= 2;
    const perMs = busy ? ratePerMs(this.busyDepartures, this.busyDeparted) : ratePerMs(this.departures, this.departed);
    return perMs === undefined ? this.maxQueue : Math.min(this.maxQueue, Math.floor(this.maxWait * perMs));
  }

  /** How long the request waiting longest, of any lane, has waited, ms; 0 with none waiting. */
  private longestWait(): number {
    let since = Number.POSITIVE_INFINITY;
    for (const lane of this.lanes.values()) since = Math.min(since, lane.oldestArrival());
    return since === Number.POSITIVE_INFINITY ? 0 : this.scheduler.now() - since;
  }

  /** A request's rank: its class, else its tenant's, else `default`; higher goes first. */
  private rankOf(tenant: string, priority: PriorityClass | undefined): number {
    return PRIORITY_CLASSES.indexOf(priority ?? (Object.hasOwn(this.tenants, tenant) ? this.tenants[tenant]! : 'default'));
  }

  /** @internal A lane handed `entry` to its pipeline. */
  delivered(entry: Waiting<unknown>): void {
    this.left();
    this.stats.deliveredCount++;
    this.stats.emittedCount++;
    const now = this.scheduler.now();
    if (this.departures.length < RATE_WINDOW) this.departures.push(now);
    else this.departures[this.departed % RATE_WINDOW] = now;
    this.departed++;
    // Only a request that waited times the queue's drain: one taken as it arrived says nothing of a busy pipeline.
    if (now > entry.arrivedAt) {
      if (this.busyDepartures.length < RATE_WINDOW) this.busyDepartures.push(now);
      else this.busyDepartures[this.busyDeparted % RATE_WINDOW] = now;
      this.busyDeparted++;
    }
    entry.trace.note(this.name, 'wait', now - entry.arrivedAt);
  }

  private left(): void {
    this.waitingCount--;
    this.stats.buffered--;
  }

  private shedLowest(arriving: Waiting<unknown>): void {
    let victim: Waiting<unknown> | undefined;
    for (const lane of this.lanes.values()) {
      const last = lane.last();
      if (last !== undefined && (victim === undefined || last.rank < victim.rank || (last.rank === victim.rank && last.seq > victim.seq))) victim = last;
    }
    if (victim === undefined) return;
    victim.lane.remove(victim);
    this.left();
    const reason = victim === arriving ? 'queue-full' : 'evicted';
    this.stats.shed[reason === 'queue-full' ? 'buffer-full' : 'evicted']++;
    victim.refuse(new AdmissionRejectedError(this.name, victim.tenant, this.retryAfter(), reason));
  }
}

/** Departures per ms over a ring of the last `RATE_WINDOW` departure times (`count` recorded in all); undefined under two. */
function ratePerMs(ring: readonly number[], count: number): number | undefined {
  const n = ring.length;
  if (n < 2) return undefined;
  const newest = ring[(count - 1) % RATE_WINDOW]!;
  const oldest = count >= RATE_WINDOW ? ring[count % RATE_WINDOW]! : ring[0]!;
  return (n - 1) / Math.max(1, newest - oldest);
}

/** One pipeline's requests in the shared queue, and the producer its pipeline pulls them through. */
class Lane<J> implements Producer, InspectedRun {
  /** Highest class first, then arrival order. */
  private readonly queue: Waiting<J>[] = [];
  private outlet: Outlet<Traced<J>> | undefined;
  /** Whether the pipeline can start a request now (`Intake.gate`). */
  ready: () => boolean = () => true;
  private pulling = false;
  private again = false;

  constructor(
    private readonly intake: Intake,
    readonly name: string,
  ) {}

  get stats(): StageStats {
    return this.intake.stats;
  }

  bind(outlet: Outlet<Traced<J>>): this {
    if (this.outlet !== undefined && !this.outlet.closed) throw new TypeError(`lane "${this.name}" of intake "${this.intake.name}" already has a pipeline`);
    this.outlet = outlet;
    return this;
  }

  insert(entry: Waiting<J>): void {
    let i = this.queue.length;
    while (i > 0 && this.queue[i - 1]!.rank < entry.rank) i--;
    this.queue.splice(i, 0, entry);
  }

  remove(entry: Waiting<J>): boolean {
    const i = this.queue.indexOf(entry);
    if (i < 0) return false;
    this.queue.splice(i, 1);
    return true;
  }

  /** Whether an offer to it now might not wait: its pipeline wants one, or has yet to start (the offer's caller starts it). */
  mightTake(): boolean {
    const outlet = this.outlet;
    return outlet === undefined || outlet.closed || (outlet.wants() && this.ready());
  }

  last(): Waiting<J> | undefined {
    return this.queue[this.queue.length - 1];
  }

  /** When the request waiting longest here arrived; infinity with none (the queue is by class, so any may be it). */
  oldestArrival(): number {
    let at = Number.POSITIVE_INFINITY;
    for (const entry of this.queue) at = Math.min(at, entry.arrivedAt);
    return at;
  }

  serve(): void {
    if (this.outlet !== undefined) this.pull();
  }

  /** Never re-entered: demand signalled while emitting (or an offer made by a consumer) loops again. */
  pull(): void {
    if (this.pulling) {
      this.again = true;
      return;
    }
    this.pulling = true;
    try {
      do {
        this.again = false;
        const outlet = this.outlet;
        while (outlet !== undefined && !outlet.closed && this.queue.length > 0 && outlet.wants() && this.ready()) {
          const entry = this.queue.shift()!;
          this.intake.delivered(entry as Waiting<unknown>);
          outlet.next(new Traced(entry.job, entry.trace));
        }
      } while (this.again);
    } finally {
      this.pulling = false;
    }
  }

  cancel(): void {
    this.outlet = undefined;
  }

  describe(): RunDescription {
    return { name: this.intake.name, kind: 'intake', capacity: this.intake.maxQueue, concurrency: 1, policy: 'shed-incoming' };
  }

  demandNow(): number {
    return this.outlet?.demand() ?? 0;
  }

  ownLink(): DemandLink | undefined {
    return undefined;
  }
}
