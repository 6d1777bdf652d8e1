import { stat } from 'node:fs/promises';
import { availableParallelism } from 'node:os';
import type * as ort from 'onnxruntime-node';
import type * as z from 'zod';
import { lazySchema, type Holds, type SchemaMatches } from '../../core/zod.js';
import { parseOptions, positiveInt } from '../../flow/options.js';
import { ModelCorruptError, ModelNotFoundError } from '../models/errors.js';
import type { PoolingPlan } from '../models/pooling.js';

/** A model file path, or the model's bytes. */
export type ModelSource = string | Uint8Array;
/** Inputs of one run, by input name. */
export type Feeds = Readonly<Record<string, ort.Tensor>>;
/** Outputs of one run, by output name. */
export type Outputs = Record<string, ort.Tensor>;

/** Options of `InferencePool`: the model, the number of worker threads and the queue bound. */
export interface InferencePoolOptions {
  /** Names the pool in errors. Default `inference-pool-N`. */
  name?: string;
  /** The pool's only model, named `"default"`. Give this or `models`. */
  model?: ModelSource;
  /** Several models by name: every worker holds one session of each. */
  models?: Readonly<Record<string, ModelSource>>;
  /** Worker threads. Default `min(os.availableParallelism(), 4)`: each holds its own copy of every model. */
  size?: number;
  /** Jobs that may wait for a busy pool; one more rejects with `PoolQueueFullError`. Default 1024. */
  maxQueue?: number;
  /** onnxruntime intra-op threads per session. Default 1, so `size` workers use `size` cores. */
  intraOpNumThreads?: number;
  /** onnxruntime inter-op threads per session. Default 1. */
  interOpNumThreads?: number;
  /** Default `'all'`. */
  graphOptimizationLevel?: 'disabled' | 'basic' | 'extended' | 'all';
  /**
   * Transfer the feeds' buffers to the worker instead of copying them (default `true`):
   * once passed to `run`, a feed's typed array is detached and must not be reused. With
   * `false` they are copied, by the time `run` returns. Feeds in shared memory (built
   * into `FeedBuffers`) are neither: the worker reads them in place, and they are leased
   * until it is done, which costs the event loop neither a copy nor garbage.
   */
  transferFeeds?: boolean;
  /**
   * Bytes of shared memory per worker that `runBorrowed` outputs are written into, so
   * they cost this thread no allocation (default 4 MiB, allocated at a worker's first
   * borrowed run; `0`: never). Outputs that do not fit come back in fresh buffers.
   */
  outputArenaBytes?: number;
  /** How long `close()` waits for a worker to finish its job and exit before terminating it (ms). Default 10 000. */
  closeTimeout?: number;
  /**
   * How far below the process's scheduling priority the worker threads run, in `nice` steps (0–19;
   * higher yields more). Above 0 the event loop that feeds them (answering sockets, refusing at the
   * door) wins a core it shares with a busy model. Applied where the OS sets it per thread (Linux);
   * elsewhere ignored. Default 0.
   */
  niceness?: number;
}

/** Options of one pool run: its abort signal, the model to run (in a pool of several) and the pooling. */
export interface RunOptions {
  /** Aborting removes a queued job (it never runs) or discards a running job's result; either way the run rejects with `AbortedError`. */
  signal?: AbortSignal;
  /** Which model to run; may be omitted when the pool holds one. */
  model?: string;
  /**
   * Pool an embedding model's output in the worker, right after `session.run` (see
   * `planPooling`): the run then resolves to `{ embeddings }` [batch, dim] alone, and a
   * `last_hidden_state` [batch, seq, dim] never crosses back to this thread.
   */
  pooling?: PoolingPlan;
}

const modelSource = lazySchema((z) =>
  z.union([z.string().min(1, { error: 'a model path must not be empty' }), z.custom<Uint8Array>((v) => v instanceof Uint8Array)], {
    error: 'a model is a file path or a Uint8Array of its bytes',
  }),
);

const poolOptionsSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      model: modelSource().optional(),
      models: z.record(z.string().min(1), modelSource()).optional(),
      size: positiveInt('size').optional(),
      maxQueue: z.number().int({ error: 'maxQueue must be an integer' }).min(0, { error: 'maxQueue must be ≥ 0' }).default(1024),
      intraOpNumThreads: positiveInt('intraOpNumThreads').default(1),
      interOpNumThreads: positiveInt('interOpNumThreads').default(1),
      graphOptimizationLevel: z.enum(['disabled', 'basic', 'extended', 'all']).default('all'),
      transferFeeds: z.boolean().default(true),
      outputArenaBytes: z
        .number()
        .int({ error: 'outputArenaBytes must be an integer' })
        .min(0, { error: 'outputArenaBytes must be ≥ 0' })
        .default(4 << 20),
      closeTimeout: z.number().positive({ error: 'closeTimeout must be > 0 ms' }).default(10_000),
      niceness: z
        .number()
        .int({ error: 'niceness must be an integer' })
        .min(0, { error: 'niceness must be ≥ 0' })
        .max(19, { error: 'niceness must be ≤ 19' })
        .default(0),
    })
    .strict()
    .refine((o) => (o.model === undefined) !== (o.models === undefined), { error: 'give exactly one of model and models', path: ['model'] })
    .refine((o) => o.models === undefined || Object.keys(o.models).length > 0, { error: 'models must name at least one model', path: ['models'] }),
);

/** @internal Fails to compile when `InferencePoolOptions` and the schema's input part ways. */
export type InferencePoolOptionsInStep = Holds<SchemaMatches<InferencePoolOptions, z.input<ReturnType<typeof poolOptionsSchema>>>>;

/** @internal The options as parsed: defaults filled in, one model under its name. */
export type PoolConfig = Omit<z.output<ReturnType<typeof poolOptionsSchema>>, 'model' | 'models' | 'size' | 'name'> & {
  readonly name: string;
  readonly size: number;
  readonly models: Readonly<Record<string, ModelSource>>;
};

const DEFAULT_MODEL = 'default';
let unnamedPool = 0;

/** @internal Checks `options` and fills in the defaults; a missing or empty model file fails here, before any worker starts. */
export async function poolConfig(options: InferencePoolOptions): Promise<PoolConfig> {
  const parsed = parseOptions(poolOptionsSchema(), options, `InferencePool${options?.name ? ` "${options.name}"` : ''} options`);
  const { model, models, size, name, ...rest } = parsed;
  const config: PoolConfig = {
    ...rest,
    name: name ?? `inference-pool-${++unnamedPool}`,
    size: size ?? Math.max(1, Math.min(availableParallelism(), 4)),
    models: models ?? { [DEFAULT_MODEL]: model! },
  };
  for (const source of Object.values(config.models)) await checkSource(source);
  return config;
}

/** Fails early, on the main thread, with the error `loadModel` would give. */
async function checkSource(source: ModelSource): Promise<void> {
  if (typeof source !== 'string') {
    if (source.length === 0) throw new ModelCorruptError('<bytes>', 'the model bytes are empty.');
    return;
  }
  const info = await stat(source).catch(() => undefined);
  if (info === undefined || !info.isFile()) throw new ModelNotFoundError(source);
  if (info.size === 0) throw new ModelCorruptError(source, 'the file is empty.');
}
