import { lazySchema } from '../../core/zod.js';
import type { Observable } from 'rxjs';
import type { Flow } from '../../flow/demand.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import type { Feeds, Outputs } from '../pool/options.js';
import { InferencePool } from '../pool/pool.js';
import type { PoolingPlan } from '../models/pooling.js';
import type { Traced } from '../../core/trace.js';
import { type Batch, batch, unbatch } from '../../../operators/batch.js';
import { stage, type StageContext, type StageOptions } from '../../../operators/stage.js';

/** Options of `infer`: the pool, how elements become feeds and outputs become results, and the batching. */
export interface InferOptions<I, R> extends Omit<StageOptions<Batch<I>>, 'conflate'> {
  /** Where the model runs: off the main thread, one session per worker. */
  pool: InferencePool;
  /** Builds one run's feeds from a whole batch (pad to the batch's longest input). */
  toFeeds: (batch: Batch<I>) => Feeds;
  /** Splits the run's outputs into one result per item, in item order. */
  fromOutputs: (outputs: Outputs, batch: Batch<I>) => readonly R[];
  /** A run takes at most this many elements. */
  maxBatch: number;
  /** How long (ms) a batch waits for more elements after its first arrived. */
  maxWait: number;
  /** The pool model to run: a name, or one per element (batches never mix models). Default: the pool's only model. */
  model?: string | ((value: I) => string);
  /** Further separates batches: elements with different keys never share a run. */
  key?: (value: I) => string;
  /**
   * Batches only elements whose lengths fall in the same bucket (`⌈length / bucket⌉`,
   * `bucket` default 16), so a short input is never padded to a long one's length.
   */
  groupBySequenceLength?: {
    /** The sequence length of an element (its token count). */
    length: (value: I) => number;
    /** The bucket width (default 16). */
    bucket?: number;
  };
  /** Elements the batcher holds across open batches before it stops asking upstream. Default `maxBatch × 2`. */
  batchCapacity?: number;
  /**
   * Pools an embedding output in the worker before it comes back (`planPooling(pool.describe().outputNames)`
   * for a `last_hidden_state` export): `fromOutputs` then receives `{ embeddings }` [batch, dim] alone.
   */
  pooling?: PoolingPlan;
  /**
   * Hand `fromOutputs` the outputs in place, in shared memory the worker reuses
   * (`pool.runBorrowed`): batches then allocate no output memory on this thread, which
   * at thousands of elements a second is what keeps V8 out of full collections (and
   * the p99 down). `fromOutputs` must then copy what it keeps — numbers, labels,
   * `row.slice()` — never return `tensorRows` views (refused with
   * `BorrowedOutputsError`). Default `false`.
   */
  borrowOutputs?: boolean;
}

/** The operator `infer` returns: elements (plain or traced) in, one traced result per element out. */
export type InferOperator<I, R> = (source: Observable<I | Traced<I>>) => Flow<Traced<R>>;

const inferOptionsSchema = lazySchema((z) =>
  z
    .object({
      // z.instanceof needs a public constructor; pools come from InferencePool.create.
      pool: z.custom<InferencePool>((v) => v instanceof InferencePool, { error: 'pool must be an InferencePool (from InferencePool.create)' }),
      toFeeds: functionSchema<(batch: Batch<unknown>) => Feeds>(),
      fromOutputs: functionSchema<(outputs: Outputs, batch: Batch<unknown>) => readonly unknown[]>(),
      maxBatch: positiveInt('maxBatch'),
      maxWait: z.number({ error: 'maxWait must be a number of ms' }).positive({ error: 'maxWait must be > 0 ms' }),
      model: z.union([z.string().min(1), functionSchema<(value: unknown) => string>()], { error: 'model must be a model name or a function' }).optional(),
      key: functionSchema<(value: unknown) => string>().optional(),
      groupBySequenceLength: z
        .object({ length: functionSchema<(value: unknown) => number>(), bucket: positiveInt('groupBySequenceLength.bucket').default(16) })
        .strict()
        .optional(),
      batchCapacity: positiveInt('batchCapacity').optional(),
      pooling: z
        .object({ output: z.string().min(1), pooling: z.enum(['none', 'mean', 'cls']), normalize: z.boolean() })
        .strict()
        .optional(),
      borrowOutputs: z.boolean({ error: 'borrowOutputs must be a boolean' }).optional(),
    })
    .refine((o) => o.batchCapacity === undefined || o.batchCapacity >= o.maxBatch, { error: 'batchCapacity must be ≥ maxBatch', path: ['batchCapacity'] }),
);

/**
 * Runs a model on a pool with dynamic micro-batching: `batch → stage → unbatch`.
 * Elements are gathered into batches of up to `maxBatch`, each sent at most
 * `maxWait` ms after its first element (or at once when full), one pool run per
 * batch; results are split back so **every element keeps its own trace**, in which
 * the stage notes `batchSize` (and `lengthBucket` when grouping by length).
 *
 * ```
 * source:  -a-b-c-d-e--------f--|
 * infer({ maxBatch: 3, maxWait: 5 })     runs [a,b,c] when full, [d,e] at maxWait, [f] on completion
 * output:  -----(ABC)---(DE)-----(F|)
 * ```
 *
 * Batches never mix models (`model` as a function) or keys (`key`), and with
 * `groupBySequenceLength` never mix length buckets, which bounds padding. Demand
 * flows end to end: while every worker is busy (stage `concurrency`, default the
 * pool size) batches keep filling up to `maxBatch`, then the batcher stops pulling
 * (`batchCapacity`). The element's `AbortSignal` (unsubscribe, `timeout`, kill
 * switch) aborts the pool job: a queued run never starts. The stage `capacity`
 * counts batches (default 1). Other options are the `stage` options.
 *
 * ## Example
 * ```ts
 * const pool = await InferencePool.create({ model: 'models/embed.onnx', size: 2 });
 * const buffers = new FeedBuffers(); // reused by every batch: no per-batch tensor memory
 * texts.pipe(
 *   infer({
 *     pool,
 *     toFeeds: (batch) => textFeeds(tokenizer, batch.items, undefined, buffers),
 *     fromOutputs: (outputs) => tensorRows(outputs.embeddings!),
 *     maxBatch: 32,
 *     maxWait: 5,
 *     groupBySequenceLength: { length: (text) => tokenizer.encode(text).length },
 *   }),
 * ).subscribe(({ value, trace }) => store(value, trace.notes?.['infer.batchSize']));
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field; a model name
 * the pool does not hold throws `UnknownModelError`.
 *
 * @see InferencePool; `batch`, `unbatch`; `embedder` for the `embed` stage.
 */
export function infer<I, R>(options: InferOptions<I, R>): InferOperator<I, R> {
  const { pool, toFeeds, fromOutputs, maxBatch, maxWait, model, key, groupBySequenceLength, batchCapacity, pooling, borrowOutputs, ...stageOptions } =
    options ?? ({} as InferOptions<I, R>);
  const name = stageOptions.name ?? 'infer';
  const parsed = parseOptions(
    inferOptionsSchema(),
    { pool, toFeeds, fromOutputs, maxBatch, maxWait, model, key, groupBySequenceLength, batchCapacity, pooling, borrowOutputs },
    `infer "${name}" options`,
  );
  const modelOf: (value: I) => string | undefined = typeof model === 'function' ? model : () => model;
  if (typeof model === 'string') pool.describe(model);
  const bucketOf =
    groupBySequenceLength === undefined ? undefined : (value: I) => Math.ceil(groupBySequenceLength.length(value) / parsed.groupBySequenceLength!.bucket);
  // Model, user key and length bucket joined by a separator no model name or key is expected to contain.
  const batchKey =
    typeof model !== 'function' && key === undefined && bucketOf === undefined
      ? undefined
      : (value: I) => `${modelOf(value) ?? ''}\u0000${key?.(value) ?? ''}\u0000${bucketOf?.(value) ?? ''}`;

  const run = async (gathered: Batch<I>, context: StageContext): Promise<Batch<R>> => {
    const first = gathered.items[0] as I;
    const feeds = toFeeds(gathered);
    const runOptions = { signal: context.signal, model: modelOf(first), pooling };
    const values =
      borrowOutputs === true
        ? await pool.runBorrowed(feeds, (outputs) => fromOutputs(outputs, gathered), runOptions)
        : fromOutputs(await pool.run(feeds, runOptions), gathered);
    const results = gathered.withResults(values);
    const bucket = bucketOf?.(first);
    for (const trace of gathered.traces) {
      trace.note(name, 'batchSize', gathered.size);
      if (bucket !== undefined) trace.note(name, 'lengthBucket', bucket);
    }
    return results;
  };

  const gather = batch<I>({
    name: `${name}.batch`,
    maxSize: maxBatch,
    maxWait,
    capacity: batchCapacity ?? maxBatch * 2,
    ...(batchKey === undefined ? {} : { key: batchKey }),
    ...(stageOptions.scheduler === undefined ? {} : { scheduler: stageOptions.scheduler }),
    ...(stageOptions.sampleRate === undefined ? {} : { sampleRate: stageOptions.sampleRate }),
  });
  const work = stage<Batch<I>, Batch<R>>(run, { capacity: 1, concurrency: pool.size, ...stageOptions, name });
  const split = unbatch<R>({ name: `${name}.unbatch`, ...(stageOptions.scheduler === undefined ? {} : { scheduler: stageOptions.scheduler }) });
  return (source) => split(work(gather(source)));
}
