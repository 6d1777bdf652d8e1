import type { Classification, Classifier } from '../models/classifier.js';
import { lazySchema } from '../../core/zod.js';
import { parseOptions } from '../../flow/options.js';
import type { InferencePool } from './pool.js';
import { textFeeds, tensorRows } from './embedder.js';
import { GUARD_LABELS } from '../models/guard.js';
import { FeedBuffers, type Tokenizer } from '../models/tokenizer.js';

/** Options of `poolClassifier`: the model to run, the labels and which label is the positive one. */
export interface PoolClassifierOptions {
  /** The pool's model to run. Default: the pool's only model. */
  model?: string;
  /** Names of the score columns, in order. Default: the generated guard's `['benign', 'injection']`. */
  labels?: readonly string[];
  /** The label whose probability is reported as the score. Default: the last label (`injection`). */
  positive?: string;
}

const classifierSchema = lazySchema((z) =>
  z
    .strictObject({
      model: z.string({ error: 'model must be a string' }).min(1, { error: 'model must not be empty' }).optional(),
      labels: z.array(z.string(), { error: 'labels must be an array of strings' }).min(1, { error: 'labels must not be empty' }).optional(),
      positive: z.string({ error: 'positive must be a string' }).optional(),
    })
    .check((ctx) => {
      const { labels = GUARD_LABELS as readonly string[], positive } = ctx.value;
      if (positive !== undefined && !labels.includes(positive))
        ctx.issues.push({ code: 'custom', input: positive, path: ['positive'], message: `positive must be one of the labels (${labels.join(', ')})` });
    }),
);

/**
 * A `guard` classifier running an ONNX text classifier (`input_ids`, `attention_mask` →
 * `scores` [batch, labels]) in the worker pool. It reports the probability of one label —
 * the one the guard's thresholds are about — so `thresholds: { flag: 0.5, block: 0.8 }`
 * read as "flag above 50 % injection, block above 80 %", whatever the other labels say.
 *
 * ## Example
 * ```ts
 * const pool = await InferencePool.create({ model: 'models/guard.onnx', size: 1 });
 * const classify = poolClassifier(pool, await loadTokenizer('models/embed.tokenizer.json'));
 * prompts.pipe(guard({ classify, thresholds: { flag: 0.5, block: 0.8 } }));
 * ```
 */
export function poolClassifier(pool: InferencePool, tokenizer: Tokenizer, options: PoolClassifierOptions = {}): Classifier {
  parseOptions(classifierSchema(), options, 'poolClassifier options');
  const labels = options.labels ?? GUARD_LABELS;
  const positive = options.positive ?? labels[labels.length - 1]!;
  const column = labels.indexOf(positive);
  const info = pool.describe(options.model);
  const output = info.outputNames[0]!;
  const buffers = new FeedBuffers(); // refilled per call: `pool.run` has copied them when it returns
  return async (text: string, signal: AbortSignal): Promise<Classification> => {
    // Borrowed: only one number is kept, so the scores need no buffer of their own on this thread.
    const score = await pool.runBorrowed(
      textFeeds(tokenizer, [text], info.inputNames, buffers),
      (outputs) => {
        const row = tensorRows(outputs[output]!)[0]!;
        if (row.length !== labels.length) throw new TypeError(`the model scores ${row.length} labels, ${labels.length} were named`);
        return row[column]!;
      },
      { signal, model: options.model },
    );
    return { label: positive, score };
  };
}
