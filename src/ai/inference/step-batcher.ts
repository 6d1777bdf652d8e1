/**
 * Iteration-level ("continuous") batching of decode steps: every generation of a model asks its
 * next step here, and the steps asked together — in the same run of microtasks, as the generations
 * a call just answered ask their next ones — run as one model call (grouped by `key`, e.g. the
 * context length, up to `maxBatch` each); steps asked while every call slot is busy wait for one. A sequence joins the next
 * call when it asks and leaves when it stops asking, so it follows its reader: a generation whose
 * client wants no token asks nothing and costs nothing; a cancelled one is dropped before its call.
 */
import { AbortedError } from '../../core/errors.js';
import { lazySchema } from '../../core/zod.js';
import { parseOptions, positiveInt } from '../../flow/options.js';

/** Options of `StepBatcher`. */
export interface StepBatcherOptions {
  /** Steps per model call at most. Default 16. */
  readonly maxBatch?: number;
  /** Model calls running at once (e.g. the pool's threads). Default 1. */
  readonly concurrency?: number;
}

/** What a `StepBatcher` weighs its steps by (tokens, for a decoder), and the most one call may carry. */
export interface StepWeights<Q> {
  /** A step's weight: the tokens it feeds, for a decoder. */
  readonly weight: (input: Q) => number;
  /** A step heavier than this alone still runs, alone. */
  readonly maxWeight: number;
}

const optionsSchema = lazySchema((z) =>
  z.strictObject({
    maxBatch: positiveInt('maxBatch').default(16),
    concurrency: positiveInt('concurrency').default(1),
    weight: z.custom<(input: never) => number>((v) => typeof v === 'function', { error: 'weight must be a function' }).optional(),
    maxWeight: positiveInt('maxWeight').optional(),
  }),
);

interface Asked<Q, R> {
  readonly input: Q;
  /** Order of asking: the group whose first step has waited longest runs next. */
  readonly ticket: number;
  readonly signal: AbortSignal;
  resolve(result: R): void;
  reject(error: unknown): void;
}

/** Counters of a `StepBatcher`. */
export interface StepBatcherStats {
  /** Model calls made. */
  readonly calls: number;
  /** Steps run, all calls together. */
  readonly steps: number;
  /** The most steps one call ran. */
  readonly largest: number;
  /** Steps asked and not yet in a call now. */
  readonly waiting: number;
  /** Calls running now. */
  readonly running: number;
  /** Steps per call at most (`maxBatch`). */
  readonly maxBatch: number;
}

/**
 * Batches `step(input)` calls into `run(inputs)` calls. `run` gets inputs of one `key` and must
 * give one result per input, in order. Bad options throw `InvalidOptionsError` naming the field.
 */
export class StepBatcher<Q, R> {
  private readonly maxBatch: number;
  private readonly concurrency: number;
  private readonly weight: ((input: Q) => number) | undefined;
  private readonly maxWeight: number;
  private readonly waiting = new Map<string, Asked<Q, R>[]>();
  private scheduled = false;
  private tickets = 0;
  /** Steps of calls just answered whose generations have not asked again yet; see `flush`. */
  private expected = 0;
  private gathering: ReturnType<typeof setImmediate> | undefined;
  private running = 0;
  private calls = 0;
  private steps = 0;
  private largest = 0;

  constructor(
    private readonly run: (inputs: readonly Q[]) => Promise<readonly R[]>,
    private readonly key: (input: Q) => string,
    options: StepBatcherOptions & Partial<StepWeights<Q>> = {},
  ) {
    const config = parseOptions(optionsSchema(), options, 'StepBatcher options');
    this.maxBatch = config.maxBatch;
    this.concurrency = config.concurrency;
    this.weight = options.weight;
    this.maxWeight = config.maxWeight ?? Number.POSITIVE_INFINITY;
  }

  /** Calls made and steps run so far. */
  get stats(): StepBatcherStats {
    let waiting = 0;
    for (const group of this.waiting.values()) waiting += group.length;
    return { calls: this.calls, steps: this.steps, largest: this.largest, waiting, running: this.running, maxBatch: this.maxBatch };
  }

  /** The result of one step, once the call it joined ran; rejects with `AbortedError` if `signal` aborts first. */
  step(input: Q, signal: AbortSignal): Promise<R> {
    if (signal.aborted) return Promise.reject(new AbortedError(undefined, 'the generation was cancelled'));
    return new Promise<R>((resolve, reject) => {
      const k = this.key(input);
      const group = this.waiting.get(k);
      const asked = { input, ticket: this.tickets++, signal, resolve, reject };
      if (group === undefined) this.waiting.set(k, [asked]);
      else group.push(asked);
      if (this.expected > 0) this.expected--;
      this.schedule();
    });
  }

  /** The steps asked in this run of microtasks join one call; a later turn would cost a lone stream a loop turn per token. */
  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    queueMicrotask(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    // The generations a call just answered ask again within microtasks: a call started before they do
    // runs out of phase with them (a lone straggler alternating with the rest), so it waits for them,
    // at most until the next loop turn (one that ended or has no demand never asks).
    if (this.expected > 0) {
      this.gathering ??= setImmediate(() => {
        this.gathering = undefined;
        this.expected = 0;
        this.flush();
      });
      return;
    }
    if (this.gathering !== undefined) {
      clearImmediate(this.gathering);
      this.gathering = undefined;
    }
    while (this.running < this.concurrency && this.waiting.size > 0) {
      const batch = this.take();
      if (batch.length === 0) continue;
      this.running++;
      this.calls++;
      this.steps += batch.length;
      this.largest = Math.max(this.largest, batch.length);
      this.run(batch.map((a) => a.input))
        .then(
          (results) => {
            if (results.length === batch.length) {
              this.expected += batch.length;
              return batch.forEach((a, i) => a.resolve(results[i]!));
            }
            const error = new TypeError(`a batched step gave ${results.length} results for ${batch.length} inputs`);
            for (const a of batch) a.reject(error);
          },
          (error: unknown) => {
            for (const a of batch) a.reject(error);
          },
        )
        .finally(() => {
          this.running--;
          if (this.waiting.size > 0 || this.expected > 0) this.schedule();
        });
    }
  }

  /**
   * Up to `maxBatch` live steps of the group that has waited longest; cancelled ones are dropped here.
   * Not the largest group: the running generations re-form theirs before every call, and a prefill
   * (a request joining) would wait behind them until they all ended.
   */
  private take(): Asked<Q, R>[] {
    let chosen: string | undefined;
    let oldest = Number.POSITIVE_INFINITY;
    for (const [k, group] of this.waiting) {
      const ticket = group[0]!.ticket;
      if (ticket < oldest) {
        chosen = k;
        oldest = ticket;
      }
    }
    const group = this.waiting.get(chosen!)!;
    const batch: Asked<Q, R>[] = [];
    let carried = 0;
    while (group.length > 0 && batch.length < this.maxBatch) {
      const asked = group[0]!;
      if (asked.signal.aborted) {
        group.shift();
        asked.reject(new AbortedError(undefined, 'the generation was cancelled'));
        continue;
      }
      const weight = this.weight?.(asked.input) ?? 0;
      if (batch.length > 0 && carried + weight > this.maxWeight) break;
      group.shift();
      carried += weight;
      batch.push(asked);
    }
    if (group.length === 0) this.waiting.delete(chosen!);
    return batch;
  }
}
