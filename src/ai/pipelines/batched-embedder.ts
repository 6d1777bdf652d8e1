/**
 * Embeddings for many concurrent callers, micro-batched: every text asked for goes through
 * one long-lived pipeline, `fromPush` → `infer` (up to `maxBatch` texts per pool run, waiting
 * at most `maxWait` ms for company), so a burst of small requests costs a few model runs.
 */
import { Subject } from 'rxjs';
import { lazySchema } from '../../core/zod.js';
import { SluiceError } from '../../core/errors.js';
import type { Batch } from '../../../operators/batch.js';
import { parseOptions, positiveInt } from '../../flow/options.js';
import { fromPush } from '../../flow/push.js';
import { StageStats } from '../../flow/stats.js';
import { untraced } from '../../flow/sinks.js';
import { infer } from '../stages/infer.js';
import { planPooling } from '../models/pooling.js';
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
}

const optionsSchema = lazySchema((z) =>
  z
    .object({
      model: z.string().min(1).optional(),
      maxBatch: positiveInt('maxBatch').default(32),
      maxWait: z.number({ error: 'maxWait must be a number of ms' }).positive({ error: 'maxWait must be > 0 ms' }).default(2),
      capacity: positiveInt('capacity').default(4096),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
    })
    .strict(),
);

interface Asked {
  readonly text: string;
  resolve(vector: Float32Array): void;
  reject(error: unknown): void;
}

/** Embeds texts in shared batches; `close()` ends the pipeline. */
export class BatchedEmbedder {
  readonly stats: StageStats;
  private readonly asked = new Subject<Asked>();
  private readonly subscription: { unsubscribe(): void };

  constructor(
    pool: InferencePool,
    private readonly tokenizer: Tokenizer,
    options: BatchedEmbedderOptions = {},
  ) {
    const config = parseOptions(optionsSchema(), options, 'BatchedEmbedder options');
    this.stats = config.stats ?? new StageStats();
    const info = pool.describe(config.model);
    const plan = planPooling(info.outputNames, {}, `model "${config.model ?? pool.models[0]}" of inference pool "${pool.name}"`);
    const buffers = new FeedBuffers();
    const fail = (batch: Batch<Asked>, error: unknown) => {
      for (const item of batch.items) item.reject(error);
    };
    this.subscription = fromPush(this.asked, {
      name: 'embeddings-in',
      capacity: config.capacity,
      // Full: the text arriving now is turned away, the ones waiting keep their place.
      policy: 'shed-incoming',
      onShed: ({ value }) => value.reject(new SluiceError('EMBEDDINGS_BUSY', `more than ${config.capacity} texts are waiting to be embedded; retry shortly`)),
    })
      .pipe(
        infer<Asked, { readonly asked: Asked; readonly vector: Float32Array }>({
          name: 'embeddings',
          pool,
          ...(config.model !== undefined && { model: config.model }),
          maxBatch: config.maxBatch,
          maxWait: config.maxWait,
          pooling: plan,
          toFeeds: (batch) =>
            textFeeds(
              tokenizer,
              batch.items.map((a) => a.text),
              info.inputNames,
              buffers,
            ),
          fromOutputs: (outputs, batch) => tensorRows(outputs.embeddings!).map((vector, i) => ({ asked: batch.items[i]!, vector })),
          // A failed run fails its own texts, not the pipeline the other callers share.
          errorPolicy: 'skip',
          onFailure: (event) => fail(event.value, event.error),
          stats: this.stats,
        }),
        untraced(),
      )
      .subscribe({
        next: ({ asked, vector }) => asked.resolve(vector),
        error: (err: unknown) => this.broken(err),
      });
  }

  private failure: unknown;

  private broken(error: unknown): void {
    this.failure = error;
  }

  /** One vector per text, in order; the prompt tokens counted with the model's tokenizer. */
  async embed(texts: readonly string[]): Promise<{ readonly vectors: Float32Array[]; readonly tokens: number }> {
    if (this.failure !== undefined) throw new SluiceError('EMBEDDINGS_FAILED', 'the embeddings pipeline stopped', { cause: this.failure });
    const vectors = await Promise.all(
      texts.map(
        (text) =>
          new Promise<Float32Array>((resolve, reject) => {
            this.asked.next({ text, resolve, reject });
          }),
      ),
    );
    const tokens = texts.reduce((n, text) => n + this.tokenizer.encode(text).length, 0);
    return { vectors, tokens };
  }

  /** Stops the embedder and releases its pipeline; texts still waiting are not embedded. */
  close(): void {
    this.asked.complete();
    this.subscription.unsubscribe();
  }
}
