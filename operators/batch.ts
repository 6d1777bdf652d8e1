import { lazySchema } from '../src/core/zod.js';
import { asyncScheduler, type Observable, type SchedulerLike, type Subscription } from 'rxjs';
import { Flow, type CoreOutlet } from '../src/flow/demand.js';
import { Inlet } from '../src/flow/inlet.js';
import { LinkedRun } from '../src/flow/linked-run.js';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../src/flow/options.js';
import { Ring } from '../src/flow/ring.js';
import { StageStats } from '../src/flow/stats.js';
import type { InspectedRun, RunDescription } from '../src/flow/introspection.js';
import { BatchMismatchError, StageError, UnpausableSourceError } from '../src/core/errors.js';
import { type TraceContext, Traced, sampler, toTraced } from '../src/core/trace.js';
import { monotonicNow } from '../src/core/clock.js';
import { SETTLES_ITEMS, giveBack } from '../src/core/settlement.js';

/**
 * Items gathered by `batch`, each with its own trace, so a batched call (one model
 * invocation for many prompts) loses no per-element tracing. `unbatch` splits it
 * back into one `Traced<T>` per item.
 */
export class Batch<T> {
  /** The `key` the items share (`undefined` when the batcher has no `key` function). */
  readonly key: string | undefined;
  readonly items: readonly T[];
  /** `traces[i]` is the trace of `items[i]`. */
  readonly traces: readonly TraceContext[];

  /** Throws `BatchMismatchError` unless there is exactly one trace per item. */
  constructor(key: string | undefined, items: readonly T[], traces: readonly TraceContext[]) {
    if (items.length !== traces.length) throw new BatchMismatchError(items.length, traces.length);
    this.key = key;
    this.items = items;
    this.traces = traces;
  }

  /** Elements in the batch. */
  get size(): number {
    return this.items.length;
  }

  /** A batch stands for its items: a sink or stage that settles it settles each (see `Settlement`). */
  get [SETTLES_ITEMS](): true {
    return true;
  }

  /**
   * The same batch with `results[i]` in place of `items[i]`, keeping key and traces:
   * what a batched work function returns so `unbatch` can give each result its
   * item's trace. Throws `BatchMismatchError` unless there is one result per item.
   */
  withResults<R>(results: readonly R[]): Batch<R> {
    if (results.length !== this.items.length) throw new BatchMismatchError(this.items.length, results.length);
    return new Batch<R>(this.key, results.slice(), this.traces);
  }
}

/** Options of `batch`: how many elements make a batch and how long a partial one may wait. */
export interface BatchOptions<T> {
  /** Names the operator in errors, traces and metrics. Default `batch-N`. */
  name?: string;
  /** A batch is emitted as soon as it holds this many items. */
  maxSize: number;
  /** A batch is emitted this long (ms) after its first item arrived, full or not (once downstream wants it). */
  maxWait: number;
  /** Gathers a separate batch, with its own timer, per key (e.g. one per model). */
  key?: (value: T) => string;
  /** Items held across all open and waiting batches; at this bound no more demand goes upstream. Default `maxSize × 4`. */
  capacity?: number;
  /** Timers and the clock. Default `asyncScheduler`; inject a `TestScheduler` or `VirtualTimeScheduler` for virtual time. */
  scheduler?: SchedulerLike;
  /** Fraction of plain (untraced) inputs whose trace records timing. Default 0. */
  sampleRate?: number;
  /** Counters shared by every subscription: `received`/`delivered` count items, `emitted` counts batches. */
  stats?: StageStats;
}

/** The operator `batch` returns: any source of `T` (plain or traced) in, a Flow of traced batches out. */
export type BatchOperator<T> = (source: Observable<T | Traced<T>>) => Flow<Traced<Batch<T>>>;

const batchOptionsSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      maxSize: positiveInt('maxSize'),
      maxWait: z.number({ error: 'maxWait must be a number of ms' }).positive({ error: 'maxWait must be > 0 ms' }),
      key: functionSchema<(value: unknown) => string>().optional(),
      capacity: positiveInt('capacity').optional(),
      scheduler: schedulerSchema().optional(),
      sampleRate: z.number({ error: 'sampleRate must be a number' }).min(0).max(1).default(0),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
    })
    .strict()
    .refine((o) => o.capacity === undefined || o.capacity >= o.maxSize, {
      error: 'capacity must be ≥ maxSize, or no batch could ever fill',
      path: ['capacity'],
    }),
);

interface BatchConfig {
  readonly name: string;
  readonly maxSize: number;
  readonly maxWait: number;
  readonly key: ((value: unknown) => string) | undefined;
  readonly capacity: number;
  readonly scheduler: SchedulerLike | undefined;
  readonly sampleRate: number;
}

let unnamedBatch = 0;

/**
 * Gathers elements into batches of at most `maxSize`, each emitted when full or
 * `maxWait` ms after its first element arrived — Akka's `groupedWithin`, with
 * backpressure on both sides.
 *
 * ```
 * source:  -a-b-c-------d-------e--|
 * batch({ maxSize: 3, maxWait: 5 })
 * output:  -----x------------y-----(z|)     x = [a,b,c] (full), y = [d] (maxWait), z = [e] (completion)
 * ```
 *
 * A batch that is due while downstream has no demand is not an error (unlike Reactor
 * `bufferTimeout` or RxJava `buffer(time, count)`): it waits, keeps filling up to
 * `maxSize`, and is emitted as soon as demand arrives. When `capacity` items are held,
 * no more demand goes upstream. With `key`, every key gathers its own batch with its
 * own timer; batches are emitted in the order they became ready (full or due), so
 * items of one key keep their order.
 *
 * Upstream completion flushes every open batch (as demand allows), then completes.
 * Upstream error errors at once: open batches are dropped and their items counted as
 * `failed` in `stats`. Unsubscribing clears every timer and the upstream subscription;
 * held items count as shed (`cancelled`).
 *
 * Each output is a `Traced<Batch<T>>` whose envelope trace is the first item's (so a
 * stage working on the whole batch records its timing there); `Batch.traces` keeps
 * every item's trace, and `unbatch` hands each item its own again.
 *
 * ## Example
 * ```ts
 * prompts.pipe(
 *   batch({ maxSize: 16, maxWait: 20, key: (p) => p.model }),
 *   stage(async (b: Batch<Prompt>) => b.withResults(await models[b.key!].generate(b.items)), { name: 'infer' }),
 *   unbatch(),
 * ); // Observable<Traced<Completion>>, each completion with its prompt's trace
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see unbatch; `Batch.withResults`.
 */
export function batch<T>(options: BatchOptions<T>): BatchOperator<T> {
  const parsed = parseOptions(batchOptionsSchema(), options, `batch${options?.name ? ` "${options.name}"` : ''} options`);
  const config: BatchConfig = {
    name: parsed.name ?? `batch-${++unnamedBatch}`,
    maxSize: parsed.maxSize,
    maxWait: parsed.maxWait,
    key: parsed.key,
    capacity: parsed.capacity ?? parsed.maxSize * 4,
    scheduler: parsed.scheduler,
    sampleRate: parsed.sampleRate,
  };
  const stats = parsed.stats ?? new StageStats();
  return (source) => new Flow<Traced<Batch<T>>>((outlet) => new BatchRun<T>(source, config, stats, outlet));
}

/** A batch being gathered or waiting for demand. */
class Gathering<T> {
  readonly items: T[] = [];
  readonly traces: TraceContext[] = [];
  /** Arrival times of sampled items (-1 for the others); allocated only when one is sampled. */
  arrivals: number[] | undefined;
  timer: Subscription | undefined;
  /** In the ready queue (full, due or flushed); a due batch keeps filling until it is emitted or full. */
  queued = false;
  readyAt = -1;

  constructor(readonly key: string | undefined) {}
}

/** One subscription of a batcher: the whole state machine, demand accounting included. */
class BatchRun<T> extends LinkedRun<T | Traced<T>> implements InspectedRun {
  protected readonly inlet: Inlet;
  /** The batch each key is filling now; Map order is opening order (used by the completion flush). */
  private readonly open = new Map<string | undefined, Gathering<T>>();
  /** Batches that may be emitted, in the order they became ready. */
  private readonly ready = new Ring<Gathering<T>>(4);
  private readonly scheduler: SchedulerLike;
  private readonly now: () => number;
  private readonly sample: (seq: number) => boolean;
  /** Items in open and ready batches: what `capacity` bounds. */
  private held = 0;
  private seq = 0;

  constructor(
    protected readonly source: Observable<T | Traced<T>>,
    private readonly config: BatchConfig,
    readonly stats: StageStats,
    protected readonly outlet: CoreOutlet<Traced<Batch<T>>>,
  ) {
    super();
    const scheduler = config.scheduler;
    this.scheduler = scheduler ?? asyncScheduler;
    this.inlet = new Inlet(this, { scheduler: this.scheduler });
    this.now = scheduler ? () => scheduler.now() : monotonicNow;
    this.sample = sampler(config.sampleRate);
  }

  // ---- Inspection ----

  describe(): RunDescription {
    return { name: this.config.name, kind: 'batch', capacity: this.config.capacity, concurrency: this.config.maxSize, policy: 'pause' };
  }

  demandNow(): number {
    return this.outlet.demand();
  }

  ownLink(): Inlet {
    return this.inlet;
  }

  // ---- Producer (downstream side) ----

  protected override onCancel(): void {
    this.stats.shed.cancelled += this.held;
  }

  // ---- RoomOwner (upstream side) ----

  room(): number {
    if (this.terminated || this.upstreamDone) return 0;
    return this.config.capacity - this.held;
  }

  // ---- upstream signals ----

  onNext(input: T | Traced<T>): void {
    if (this.terminated || this.upstreamDone) {
      if (input instanceof Traced) giveBack(input.value, input.trace.settlement); // §2.8: late elements after cancel are not taken
      return;
    }
    const asked = this.inlet.arrive();
    this.stats.receivedCount++;
    const seq = this.seq++;
    const element = input instanceof Traced ? (input as Traced<T>) : toTraced(input, seq, this.sample(seq));
    const value = element.value;
    const trace = element.trace;
    // A linked producer asked before emitting; a bounded overshoot comes only from a plain
    // operator expanding one element into several. Anything else cannot be paused.
    if (this.held >= this.config.capacity && !asked) {
      this.stats.failed++;
      this.fail(new UnpausableSourceError(this.config.name, this.config.capacity));
      return;
    }
    let key: string | undefined;
    if (this.config.key !== undefined) {
      try {
        key = this.config.key(value);
      } catch (err) {
        this.stats.failed++;
        this.fail(new StageError(this.config.name, seq, err));
        return;
      }
    }
    let gathering = this.open.get(key);
    if (gathering === undefined) gathering = this.openBatch(key);
    gathering.items.push(value);
    gathering.traces.push(trace);
    if (trace.sampled) {
      const arrivals = (gathering.arrivals ??= new Array<number>(gathering.items.length - 1).fill(-1));
      arrivals.push(this.now()); // not trace.lastExit: the stage before may read another clock than our scheduler
    } else if (gathering.arrivals !== undefined) {
      gathering.arrivals.push(-1);
    }
    this.held++;
    this.stats.buffered++;
    if (gathering.items.length >= this.config.maxSize) {
      this.close(gathering);
      this.markReady(gathering);
      this.drain();
    } else if (this.held >= this.config.capacity && !this.paused) {
      this.paused = true;
      this.onPause();
    }
  }

  override onUpstreamComplete(): void {
    if (this.terminated || this.upstreamDone) return;
    this.upstreamDone = true;
    this.upstream?.unsubscribe();
    for (const gathering of this.open.values()) {
      this.stopTimer(gathering);
      this.markReady(gathering);
    }
    this.open.clear();
    this.drain();
  }

  onUpstreamError(err: unknown): void {
    this.fail(err);
  }

  // ---- the state machine ----

  private openBatch(key: string | undefined): Gathering<T> {
    const gathering = new Gathering<T>(key);
    this.open.set(key, gathering);
    gathering.timer = this.scheduler.schedule(() => {
      gathering.timer = undefined;
      if (this.terminated) return;
      this.markReady(gathering);
      this.drain();
    }, this.config.maxWait);
    return gathering;
  }

  /** The batch takes no more items: the key's next item opens a new batch (and timer). */
  private close(gathering: Gathering<T>): void {
    this.stopTimer(gathering);
    if (this.open.get(gathering.key) === gathering) this.open.delete(gathering.key);
  }

  private stopTimer(gathering: Gathering<T>): void {
    gathering.timer?.unsubscribe();
    gathering.timer = undefined;
  }

  private markReady(gathering: Gathering<T>): void {
    if (gathering.queued) return;
    gathering.queued = true;
    if (gathering.arrivals !== undefined) gathering.readyAt = this.now();
    this.ready.push(gathering);
  }

  /** Emits ready batches, in the order they became ready. */
  protected deliver(): void {
    while (!this.terminated && this.ready.length > 0 && this.outlet.wants()) this.emit(this.ready.shift()!);
  }

  protected holding(): boolean {
    return this.ready.length > 0;
  }

  protected override onPause(): void {
    this.stats.pauses++;
  }

  private emit(gathering: Gathering<T>): void {
    this.close(gathering);
    const size = gathering.items.length;
    this.held -= size;
    this.stats.buffered -= size;
    this.stats.deliveredCount += size;
    this.stats.emittedCount++;
    if (gathering.arrivals !== undefined) this.record(gathering);
    // The gathering is closed, so its arrays are never touched again: handed over, not copied.
    const out = new Batch<T>(gathering.key, gathering.items, gathering.traces);
    this.outlet.nextTraced(out, gathering.traces[0]!);
  }

  /** queueWait: arrival until the batch was ready; paused: ready until downstream took it. */
  private record(gathering: Gathering<T>): void {
    const end = this.now();
    const arrivals = gathering.arrivals!;
    for (let i = 0; i < arrivals.length; i++) {
      const arrivedAt = arrivals[i]!;
      if (arrivedAt < 0) continue;
      const trace = gathering.traces[i]!;
      if (trace.sampled) trace.keep(this.config.name, gathering.readyAt - arrivedAt, 0, end - gathering.readyAt, 0, 0, undefined);
      trace.lastExit = end;
    }
  }

  /** Documented choice: an error ends the stream at once; held batches are dropped and count as failed. */
  private fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    this.stats.failed += this.held;
    this.release();
    this.outlet.error(error);
  }

  protected release(): void {
    // Held when the run ended (cancelled or failed): their sources may offer them again.
    for (const gathering of this.open.values()) {
      this.stopTimer(gathering);
      for (const trace of gathering.traces) giveBack(undefined, trace.settlement);
    }
    this.open.clear();
    for (const gathering of this.ready.drain()) {
      this.stopTimer(gathering);
      for (const trace of gathering.traces) giveBack(undefined, trace.settlement);
    }
    this.stats.buffered -= this.held;
    this.held = 0;
    this.upstream?.unsubscribe();
    this.inlet.close();
  }
}

/** Options of `unbatch`. */
export interface UnbatchOptions {
  /** Names the operator in errors and metrics. Default `unbatch-N`. */
  name?: string;
  /** Batches held (the one being split included); at this bound no more demand goes upstream. Default 1. */
  capacity?: number;
  /** Counters shared by every subscription: `received`/`delivered` count batches, `emitted` counts items. */
  stats?: StageStats;
  /** Timers of the demand link (waits for elements a deferring operator upstream may hold). Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
}

/** The operator `unbatch` returns: batches (plain or traced) in, one traced item per output. */
export type UnbatchOperator<T> = (source: Observable<Batch<T> | Traced<Batch<T>>>) => Flow<Traced<T>>;

const unbatchOptionsSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      capacity: positiveInt('capacity').default(1),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
      scheduler: schedulerSchema().optional(),
    })
    .strict(),
);

let unnamedUnbatch = 0;

/**
 * Splits each `Batch<T>` into its items, one `Traced<T>` per item, each carrying
 * **its own item's trace** (not the batch envelope's), so traces survive a batched call.
 *
 * ```
 * source:  ----x---------(y|)       x = [a,b,c], y = [d]
 * unbatch()
 * output:  ----(abc)-----(d|)       (as fast as downstream asks)
 * ```
 *
 * Items go out only while downstream wants them; while a batch is being split no
 * more demand goes upstream (beyond `capacity` batches). Upstream completion emits
 * what is held, then completes; upstream error errors at once, dropping held items.
 *
 * ## Example
 * ```ts
 * prompts.pipe(
 *   batch({ maxSize: 8, maxWait: 10 }),
 *   stage((b: Batch<string>) => b.withResults(model.runBatch(b.items)), { name: 'infer' }),
 *   unbatch(),
 * ).subscribe(({ value, trace }) => log(trace.traceId, value));
 * ```
 *
 * @see batch; `Batch.withResults`.
 */
export function unbatch<T>(options: UnbatchOptions = {}): UnbatchOperator<T> {
  const parsed = parseOptions(unbatchOptionsSchema(), options, `unbatch${options?.name ? ` "${options.name}"` : ''} options`);
  const name = parsed.name ?? `unbatch-${++unnamedUnbatch}`;
  const stats = parsed.stats ?? new StageStats();
  const scheduler = parsed.scheduler ?? asyncScheduler;
  return (source) => new Flow<Traced<T>>((outlet) => new UnbatchRun<T>(source, name, parsed.capacity, scheduler, stats, outlet));
}

/** One subscription of `unbatch`. */
class UnbatchRun<T> extends LinkedRun<Batch<T> | Traced<Batch<T>>> {
  protected readonly inlet: Inlet;
  private readonly queue = new Ring<Batch<T>>(2);
  /** Next item of `queue.peek()` to emit. */
  private index = 0;
  private seq = 0;

  constructor(
    protected readonly source: Observable<Batch<T> | Traced<Batch<T>>>,
    private readonly name: string,
    private readonly capacity: number,
    scheduler: SchedulerLike,
    private readonly stats: StageStats,
    protected readonly outlet: CoreOutlet<Traced<T>>,
  ) {
    super();
    this.inlet = new Inlet(this, { scheduler });
  }

  protected override onCancel(): void {
    this.stats.shed.cancelled += this.queue.length;
  }

  room(): number {
    if (this.terminated || this.upstreamDone) return 0;
    return this.capacity - this.queue.length;
  }

  onNext(input: Batch<T> | Traced<Batch<T>>): void {
    if (this.terminated || this.upstreamDone) {
      giveBack(input instanceof Traced ? input.value : input, input instanceof Traced ? input.trace.settlement : undefined);
      return;
    }
    const asked = this.inlet.arrive();
    this.stats.receivedCount++;
    const seq = this.seq++;
    const value: unknown = input instanceof Traced ? input.value : input;
    if (!(value instanceof Batch)) {
      this.stats.failed++;
      this.fail(new StageError(this.name, seq, new TypeError('unbatch expects Batch values (from batch() or Batch.withResults)')));
      return;
    }
    if (this.queue.length >= this.capacity && !asked) {
      this.stats.failed++;
      this.fail(new UnpausableSourceError(this.name, this.capacity));
      return;
    }
    const received = value as Batch<T>;
    // Items go on with their own traces; an envelope with a trace of its own is done with here.
    if (input instanceof Traced && (received.size === 0 || input.trace !== received.traces[0])) input.trace.settlement?.deliver();
    if (received.size === 0) {
      this.stats.deliveredCount++;
      return;
    }
    this.queue.push(received);
    this.stats.buffered += received.size;
    this.drain();
  }

  onUpstreamError(err: unknown): void {
    this.fail(err);
  }

  protected deliver(): void {
    while (!this.terminated && this.queue.length > 0 && this.outlet.wants()) {
      const current = this.queue.peek()!;
      const i = this.index++;
      if (this.index === current.size) {
        this.queue.shift();
        this.index = 0;
        this.stats.deliveredCount++;
      }
      this.stats.buffered--;
      this.stats.emittedCount++;
      this.outlet.nextTraced(current.items[i] as T, current.traces[i]!);
    }
  }

  protected holding(): boolean {
    return this.queue.length > 0;
  }

  protected override onPause(): void {
    this.stats.pauses++;
  }

  private fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    this.stats.failed += this.queue.length;
    this.release();
    this.outlet.error(error);
  }

  protected release(): void {
    let held = 0;
    const first = this.queue.peek();
    for (const pending of this.queue.drain()) {
      held += pending.size;
      // Items not yet handed on when the run ended: their sources may offer them again.
      for (let i = pending === first ? this.index : 0; i < pending.size; i++) giveBack(undefined, pending.traces[i]!.settlement);
    }
    if (first !== undefined) held -= this.index;
    this.stats.buffered -= held;
    this.index = 0;
    this.upstream?.unsubscribe();
    this.inlet.close();
  }
}
