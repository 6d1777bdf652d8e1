import type * as z from 'zod';
import { lazySchema } from '../src/core/zod.js';
import { asyncScheduler, type Observable, type SchedulerLike, type Subscription } from 'rxjs';
import { Flow, type CoreOutlet } from '../src/flow/demand.js';
import { Inlet } from '../src/flow/inlet.js';
import { LinkedRun } from '../src/flow/linked-run.js';
import { functionSchema, parseOptions, schedulerSchema } from '../src/flow/options.js';
import { StageStats } from '../src/flow/stats.js';
import type { InspectedRun, RunDescription } from '../src/flow/introspection.js';
import { callHook } from '../src/flow/report.js';
import { StageError } from '../src/core/errors.js';
import { AdmissionRejectedError } from '../src/core/errors.js';
import { TokenBuckets } from '../src/core/token-bucket.js';
import { TraceContext, Traced } from '../src/core/trace.js';
import { forEachSettlement, giveBack } from '../src/core/settlement.js';

/** A request turned away: reported to `onReject` and counted in `stats` (`shed['buffer-full']` or `shed.evicted`). */
export interface RejectEvent<T> {
  readonly stage: string;
  readonly value: T;
  readonly tenant: string;
  readonly error: AdmissionRejectedError;
  readonly seq: number;
  readonly trace: TraceContext;
}

/** Options of `admission`: the rate, tenants and priorities, the queue bound and a report of what is refused. */
export interface AdmissionOptions<T> {
  /** Names the operator in errors, traces and metrics. Default `admission-N`. */
  name?: string;
  /** Each tenant's token bucket: `perTenant` requests per second, up to `burst` at once. */
  rate: { perTenant: number; burst: number };
  /** The tenant a request counts against. */
  tenant: (value: T) => string;
  /** Higher goes first among requests whose tenant has a token. Default 0 for all (arrival order). */
  priority?: (value: T) => number;
  /** Requests that may wait (for a token or for downstream demand), across tenants; 0 = none wait. */
  maxQueue: number;
  /** Called with every element refused, and why. */
  onReject?: (event: RejectEvent<T>) => void;
  /** Timers (refills) and the clock. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
  /** Counters shared by every subscription: rejections count as shed (`buffer-full`, `evicted`). */
  stats?: StageStats;
}

/** The operator `admission` returns: requests (plain or traced) in, a Flow of the admitted ones out. */
export type AdmissionOperator<T> = (source: Observable<T | Traced<T>>) => Flow<Traced<T>>;

const admissionSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      rate: z
        .object({
          perTenant: z.number({ error: 'perTenant must be a number (requests per second)' }).positive({ error: 'perTenant must be > 0' }),
          burst: z.number({ error: 'burst must be a number' }).min(1, { error: 'burst must be ≥ 1' }),
        })
        .strict(),
      tenant: functionSchema<(value: unknown) => string>(),
      priority: functionSchema<(value: unknown) => number>().optional(),
      maxQueue: z.number({ error: 'maxQueue must be a number' }).int({ error: 'maxQueue must be an integer' }).min(0, { error: 'maxQueue must be ≥ 0' }),
      onReject: functionSchema<(event: RejectEvent<unknown>) => void>().optional(),
      scheduler: schedulerSchema().optional(),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
    })
    .strict(),
);

type AdmissionConfig = z.output<ReturnType<typeof admissionSchema>> & { readonly label: string };

let unnamed = 0;

/**
 * Admission control at the door of a pipeline: a token bucket per tenant, priority
 * among waiting requests, and a bounded queue that turns requests away with a
 * `retryAfter` rather than letting latency grow without bound.
 *
 * ```
 * source:  (abcd)|               one tenant, rate 100/s (a token per 10 ms), burst 2, maxQueue 1
 * admission(...)
 * output:  (ab) 6ms (c|)          d rejected: AdmissionRejectedError { tenant, retryAfter: 20 }
 * ```
 *
 * A request goes out when its tenant's bucket has a token **and** downstream wants
 * it; among such requests the highest `priority` goes first, then the oldest. A tenant
 * out of tokens holds back only its own requests. When more than `maxQueue` requests
 * wait, the lowest-priority newest one is turned away — the arriving request, or
 * (`evicted`) a waiting one of lower priority — with `AdmissionRejectedError` (code
 * `ADMISSION_REJECTED`, the tenant, `retryAfter` in ms: the time the tenant's bucket
 * needs to cover its waiting requests and this one, at least one token's worth).
 *
 * Every rejection is accounted: reported to `onReject` and counted in `stats`
 * (`shed['buffer-full']` when turned away on arrival, `shed.evicted` when evicted),
 * so `received === delivered + shed + failed` once a run has ended.
 *
 * Demand: downstream demand is kept (nothing is emitted unless wanted), but
 * admission never pauses its source — deciding at the door is its job, so it takes
 * every request and holds at most `maxQueue` (it is a `shed` policy, not `pause`).
 * Each admitted request's trace notes its wait (`"<name>.wait"`, ms). Upstream
 * completion lets the queue drain, then completes; upstream error errors at once
 * (waiting requests count as failed); unsubscribing sheds them as `cancelled`.
 *
 * ## Example
 * ```ts
 * requests$.pipe(
 *   admission({
 *     rate: { perTenant: 5, burst: 10 }, tenant: (r) => r.apiKey, priority: (r) => (r.plan === 'pro' ? 1 : 0), maxQueue: 100,
 *     onReject: ({ value, error }) => value.reply(429, { 'retry-after': Math.ceil(error.retryAfter / 1000) }),
 *   }),
 *   stage(generate, { name: 'infer' }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field. Finding the next
 * request scans the queue (O(`maxQueue`)), bounded by the option.
 */
export function admission<T>(options: AdmissionOptions<T>): AdmissionOperator<T> {
  const parsed = parseOptions(admissionSchema(), options, `admission${options?.name ? ` "${options.name}"` : ''} options`);
  const config: AdmissionConfig = { ...parsed, label: parsed.name ?? `admission-${++unnamed}` };
  const stats = parsed.stats ?? new StageStats();
  return (source) => new Flow<Traced<T>>((outlet) => new AdmissionRun<T>(source, config, stats, outlet));
}

interface Waiting<T> {
  readonly value: T;
  readonly trace: TraceContext;
  readonly seq: number;
  readonly tenant: string;
  readonly priority: number;
  readonly arrivedAt: number;
}

/** One subscription of `admission`: the whole state machine. */
class AdmissionRun<T> extends LinkedRun<T | Traced<T>> implements InspectedRun {
  protected readonly inlet: Inlet;
  private readonly scheduler: SchedulerLike;
  private readonly now: () => number;
  private readonly buckets: TokenBuckets;
  /** Highest priority first, then arrival order: kept sorted on insert. */
  private readonly waiting: Waiting<T>[] = [];
  private readonly waitingPerTenant = new Map<string, number>();
  private refill: Subscription | undefined;
  private refillAt = Infinity;
  private seq = 0;

  constructor(
    protected readonly source: Observable<T | Traced<T>>,
    private readonly config: AdmissionConfig,
    readonly stats: StageStats,
    protected readonly outlet: CoreOutlet<Traced<T>>,
  ) {
    super();
    const scheduler = (this.scheduler = config.scheduler ?? asyncScheduler);
    // The scheduler's clock, not performance.now(): refills must follow the timers that wait for them (and virtual time).
    this.now = () => scheduler.now();
    this.inlet = new Inlet(this, { scheduler: this.scheduler });
    this.buckets = new TokenBuckets(config.rate.perTenant, config.rate.burst, this.now);
  }

  describe(): RunDescription {
    return { name: this.config.label, kind: 'admission', capacity: this.config.maxQueue, concurrency: 1, policy: 'shed-incoming' };
  }

  demandNow(): number {
    return this.outlet.demand();
  }

  ownLink(): Inlet {
    return this.inlet;
  }

  protected override onCancel(): void {
    this.stats.shed.cancelled += this.waiting.length;
    for (const entry of this.waiting) giveBack(entry.value, entry.trace.settlement);
  }

  /** Never pauses the source: requests are decided at the door. */
  room(): number {
    return this.terminated || this.upstreamDone ? 0 : Infinity;
  }

  onNext(input: T | Traced<T>): void {
    if (this.terminated || this.upstreamDone) {
      if (input instanceof Traced) giveBack(input.value, input.trace.settlement); // late: not taken
      return;
    }
    this.inlet.arrive();
    this.stats.receivedCount++;
    const seq = this.seq++;
    let value: T;
    let trace: TraceContext;
    if (input instanceof Traced) {
      value = (input as Traced<T>).value;
      trace = (input as Traced<T>).trace;
    } else {
      value = input;
      trace = new TraceContext(seq, false);
    }
    let tenant: string;
    let priority: number;
    try {
      tenant = (this.config.tenant as (value: T) => string)(value);
      priority = this.config.priority ? (this.config.priority as (value: T) => number)(value) : 0;
    } catch (err) {
      this.stats.failed++;
      this.fail(new StageError(this.config.label, seq, err));
      return;
    }
    const entry: Waiting<T> = { value, trace, seq, tenant, priority, arrivedAt: this.now() };
    this.insert(entry);
    this.drain();
    // Over the limit: the lowest-priority newest request goes, which may be this one or a waiting one.
    while (!this.terminated && this.waiting.length > this.config.maxQueue) {
      const victim = this.waiting.pop()!;
      this.forget(victim);
      this.reject(victim, victim === entry ? 'queue-full' : 'evicted');
    }
  }

  onUpstreamError(err: unknown): void {
    this.fail(err);
  }

  private insert(entry: Waiting<T>): void {
    let i = this.waiting.length;
    while (i > 0 && this.waiting[i - 1]!.priority < entry.priority) i--;
    this.waiting.splice(i, 0, entry);
    this.waitingPerTenant.set(entry.tenant, (this.waitingPerTenant.get(entry.tenant) ?? 0) + 1);
    this.stats.buffered++;
  }

  private forget(entry: Waiting<T>): void {
    const count = this.waitingPerTenant.get(entry.tenant)! - 1;
    if (count === 0) this.waitingPerTenant.delete(entry.tenant);
    else this.waitingPerTenant.set(entry.tenant, count);
    this.stats.buffered--;
  }

  private reject(entry: Waiting<T>, reason: 'queue-full' | 'evicted'): void {
    const ahead = this.waitingPerTenant.get(entry.tenant) ?? 0;
    const retryAfter = Math.max(this.buckets.timeUntil(entry.tenant, ahead + 1), Math.ceil(1000 / this.config.rate.perTenant));
    const error = new AdmissionRejectedError(this.config.label, entry.tenant, retryAfter, reason);
    const shed = reason === 'queue-full' ? 'buffer-full' : 'evicted';
    this.stats.shed[shed]++;
    forEachSettlement(entry.value, entry.trace.settlement, (settlement) => settlement.shed(shed));
    callHook(this.config.onReject, { stage: this.config.label, value: entry.value, tenant: entry.tenant, error, seq: entry.seq, trace: entry.trace });
  }

  /** Emits admissible requests while downstream wants them; then waits for a token or for demand. Never re-entered. */
  protected deliver(): void {
    while (!this.terminated && this.waiting.length > 0 && this.outlet.wants()) {
      const index = this.nextAdmissible();
      if (index < 0) break;
      const [entry] = this.waiting.splice(index, 1) as [Waiting<T>];
      this.buckets.take(entry.tenant);
      this.forget(entry);
      this.stats.deliveredCount++;
      this.stats.emittedCount++;
      entry.trace.note(this.config.label, 'wait', this.now() - entry.arrivedAt);
      this.outlet.nextTraced(entry.value, entry.trace);
    }
  }

  protected holding(): boolean {
    return this.waiting.length > 0;
  }

  /** Upstream is never paused here (requests are decided at the door): only a wake-up when the next tenant's token is due. */
  protected override afterDrain(): void {
    this.scheduleRefill();
  }

  /** The first waiting request (in priority order) whose tenant has a token, or -1. */
  private nextAdmissible(): number {
    const blocked = new Set<string>();
    for (let i = 0; i < this.waiting.length; i++) {
      const tenant = this.waiting[i]!.tenant;
      if (blocked.has(tenant)) continue;
      if (this.buckets.tokens(tenant) >= 1) return i;
      blocked.add(tenant);
    }
    return -1;
  }

  /** Requests that wait for a token (not for demand: `pull` brings that) wake at the earliest refill. */
  private scheduleRefill(): void {
    let wait = Infinity;
    for (const tenant of this.waitingPerTenant.keys()) wait = Math.min(wait, this.buckets.timeUntil(tenant, 1));
    if (wait === 0 || wait === Infinity) return; // a token is there: only demand is missing
    const at = this.now() + wait;
    if (this.refill !== undefined && this.refillAt <= at) return;
    this.refill?.unsubscribe();
    this.refillAt = at;
    this.refill = this.scheduler.schedule(() => {
      this.refill = undefined;
      this.refillAt = Infinity;
      this.drain();
    }, wait);
  }

  /** Documented choice: an error ends the stream at once; waiting requests count as failed. */
  private fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    this.stats.failed += this.waiting.length;
    for (const entry of this.waiting) giveBack(entry.value, entry.trace.settlement);
    this.release();
    this.outlet.error(error);
  }

  protected release(): void {
    this.stats.buffered -= this.waiting.length;
    this.waiting.length = 0;
    this.waitingPerTenant.clear();
    this.refill?.unsubscribe();
    this.refill = undefined;
    this.upstream?.unsubscribe();
    this.inlet.close();
  }
}
