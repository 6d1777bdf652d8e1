/**
 * Embeddings for many concurrent callers, micro-batched: every text asked for goes through
 * one long-lived pipeline, `fromPush` → `infer` (up to `maxBatch` texts per pool run, waiting
 * at most `maxWait` ms for company), so a burst of small requests costs a few model runs.
 */
import { lazySchema } from '../../core/zod.js';
import { parseOptions, positiveInt } from '../../flow/options.js';
import { StageStats } from '../../flow/stats.js';
import { BatchedTexts } from './batched-texts.js';
import { planPooling, type PoolingOptions } from '../models/pooling.js';
import type { InferencePool } from '../pool/pool.js';
import { tensorRows, textFeeds } from '../pool/embedder.js';
import { FeedBuffers, type Tokenizer } from '../models/tokenizer.js';

/** Options of `BatchedEmbedder`: the batch size and how long a partial batch waits. */
export interface BatchedEmbedderOptions {
  /** The pool model. Default: the pool's only model. */
  readonly model?: string;
  /** Texts per model run at most. Default 32. */
  readonly maxBatch?: number;
  /** How long a text waits for others to share its run, ms. Default 2. */
  readonly maxWait?: number;
  /** Texts waiting at most; beyond, the text fails with `EMBEDDINGS_BUSY`. Default 4096. */
  readonly capacity?: number;
  /** Counters of the `embeddings` stage. */
  readonly stats?: StageStats;
  /** How the model's outputs become one vector per text (a user's model: see `loadEmbeddingDir`). Default: `planPooling`'s defaults. */
  readonly pooling?: PoolingOptions;
}

const optionsSchema = lazySchema((z) =>
  z
    .object({
      model: z.string().min(1).optional(),
      maxBatch: positiveInt('maxBatch').default(32),
      maxWait: z.number({ error: 'maxWait must be a number of ms' }).positive({ error: 'maxWait must be > 0 ms' }).default(2),
      capacity: positiveInt('capacity').default(4096),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
      pooling: z
        .strictObject({
          output: z.string().min(1).optional(),
          pooling: z.enum(['none', 'mean', 'cls']).optional(),
          normalize: z.boolean().optional(),
        })
        .optional(),
    })
    .strict(),
);

/** Embeds texts in shared batches; `close()` ends the pipeline. */
export class BatchedEmbedder {
  readonly stats: StageStats;
  /**
   * The vectors alone, one per text, in order: the shape `embed`'s and `ragWorker`'s `embedder`
   * take. Unlike `embed`, it does not tokenize the texts a second time to count their tokens.
   */
  readonly embedder: (texts: readonly string[]) => Promise<Float32Array[]>;
  private readonly texts: BatchedTexts<Float32Array>;

  constructor(
    pool: InferencePool,
    private readonly tokenizer: Tokenizer,
    options: BatchedEmbedderOptions = {},
  ) {
    const config = parseOptions(optionsSchema(), options, 'BatchedEmbedder options');
    this.stats = config.stats ?? new StageStats();
    const info = pool.describe(config.model);
    const buffers = new FeedBuffers();
    this.texts = new BatchedTexts(pool, {
      name: 'embeddings',
      code: 'EMBEDDINGS',
      model: config.model,
      maxBatch: config.maxBatch,
      maxWait: config.maxWait,
      capacity: config.capacity,
      stats: this.stats,
      pooling: planPooling(info.outputNames, config.pooling ?? {}, `model "${config.model ?? pool.models[0]}" of inference pool "${pool.name}"`),
      toFeeds: (texts) => textFeeds(tokenizer, texts, info.inputNames, buffers),
      fromOutputs: (outputs) => tensorRows(outputs.embeddings!),
    });
    this.embedder = (texts) => Promise.all(texts.map((text) => this.texts.ask(text)));
  }

  /** One vector per text, in order; the prompt tokens counted with the model's tokenizer. */
  async embed(texts: readonly string[]): Promise<{ readonly vectors: Float32Array[]; readonly tokens: number }> {
    const vectors = await this.embedder(texts);
    const tokens = texts.reduce((n, text) => n + this.tokenizer.encode(text).length, 0);
    return { vectors, tokens };
  }

  /** Stops the embedder and releases its pipeline; texts still waiting are not embedded. */
  close(): void {
    this.texts.close();
  }
}
