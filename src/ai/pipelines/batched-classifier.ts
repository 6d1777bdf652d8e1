/**
 * The guard's classifier for many concurrent callers: texts asked for at once share pool runs
 * (`BatchedTexts`), as `BatchedEmbedder` does for embeddings, so a burst of questions costs a few
 * runs of the guard model rather than one each.
 */
import { lazySchema } from '../../core/zod.js';
import { parseOptions, positiveInt } from '../../flow/options.js';
import { StageStats } from '../../flow/stats.js';
import type { Classification, Classifier } from '../models/classifier.js';
import { GUARD_LABELS } from '../models/guard.js';
import { FeedBuffers, type Tokenizer } from '../models/tokenizer.js';
import { tensorRows, textFeeds } from '../pool/embedder.js';
import type { InferencePool } from '../pool/pool.js';
import { BatchedTexts } from './batched-texts.js';

/** Options of `BatchedClassifier`: the model and its labels, and how batches are made. */
export interface BatchedClassifierOptions {
  /** The pool's model to run. Default: the pool's only model. */
  readonly model?: string;
  /** Names of the score columns, in order. Default: the generated guard's `['benign', 'injection']`. */
  readonly labels?: readonly string[];
  /** The label whose probability is reported as the score. Default: the last label. */
  readonly positive?: string;
  /** Texts per model run at most. Default 32. */
  readonly maxBatch?: number;
  /** How long a text waits for others to share its run, ms. Default 2. */
  readonly maxWait?: number;
  /** Texts waiting at most; beyond, the text fails with `CLASSIFIER_BUSY`. Default 4096. */
  readonly capacity?: number;
  /** Counters of its `classifier` stage. */
  readonly stats?: StageStats;
}

const optionsSchema = lazySchema((z) =>
  z
    .strictObject({
      model: z.string({ error: 'model must be a string' }).min(1, { error: 'model must not be empty' }).optional(),
      labels: z
        .array(z.string(), { error: 'labels must be an array of strings' })
        .min(1, { error: 'labels must not be empty' })
        .default([...GUARD_LABELS]),
      positive: z.string({ error: 'positive must be a string' }).optional(),
      maxBatch: positiveInt('maxBatch').default(32),
      maxWait: z.number({ error: 'maxWait must be a number of ms' }).positive({ error: 'maxWait must be > 0 ms' }).default(2),
      capacity: positiveInt('capacity').default(4096),
      stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
    })
    .check((ctx) => {
      const { labels, positive } = ctx.value;
      if (positive !== undefined && !labels.includes(positive))
        ctx.issues.push({ code: 'custom', input: positive, path: ['positive'], message: `positive must be one of the labels (${labels.join(', ')})` });
    }),
);

/**
 * Scores texts with an ONNX text classifier (`input_ids`, `attention_mask` → scores [batch,
 * labels]) in shared batches; `classify` is a `Classifier` for `guard`. Bad options throw
 * `InvalidOptionsError` naming the field.
 *
 * ## Example
 * ```ts
 * const pool = await InferencePool.create({ model: 'models/guard.onnx', size: 1 });
 * const guardModel = new BatchedClassifier(pool, await loadTokenizer('models/embed.tokenizer.json'));
 * prompts.pipe(guard({ classify: guardModel.classify, thresholds: { flag: 0.5, block: 0.8 }, concurrency: 16 }));
 * ```
 */
export class BatchedClassifier {
  readonly stats: StageStats;
  /** The `Classifier`: one text's score of the positive label. */
  readonly classify: Classifier;
  private readonly texts: BatchedTexts<number>;

  constructor(pool: InferencePool, tokenizer: Tokenizer, options: BatchedClassifierOptions = {}) {
    const config = parseOptions(optionsSchema(), options, 'BatchedClassifier options');
    this.stats = config.stats ?? new StageStats();
    const { labels } = config;
    const positive = config.positive ?? labels[labels.length - 1]!;
    const column = labels.indexOf(positive);
    const info = pool.describe(config.model);
    const output = info.outputNames[0]!;
    const buffers = new FeedBuffers();
    this.texts = new BatchedTexts(pool, {
      name: 'classifier',
      code: 'CLASSIFIER',
      model: config.model,
      maxBatch: config.maxBatch,
      maxWait: config.maxWait,
      capacity: config.capacity,
      stats: this.stats,
      toFeeds: (texts) => textFeeds(tokenizer, texts, info.inputNames, buffers),
      fromOutputs: (outputs) =>
        tensorRows(outputs[output]!).map((row) => {
          if (row.length !== labels.length) throw new TypeError(`the model scores ${row.length} labels, ${labels.length} were named`);
          return row[column]!;
        }),
    });
    this.classify = (text: string): Promise<Classification> => this.texts.ask(text).then((score) => ({ label: positive, score }));
  }

  /** Stops its pipeline; texts still waiting are not scored. */
  close(): void {
    this.texts.close();
  }
}
