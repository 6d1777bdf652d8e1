import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';
import { lazySchema } from '../../core/zod.js';
import { parseOptions } from '../../flow/options.js';
import type { Feeds } from './options.js';
import type { InferencePool } from './pool.js';
import { planPooling, type PoolingOptions } from '../models/pooling.js';
import { FeedBuffers, type Tokenizer } from '../models/tokenizer.js';

const ortRuntime = onnxruntime();

/**
 * Tokenizes `texts` into the feeds of a BERT-style text model: `input_ids` and
 * `attention_mask` `[batch, seq]` int64, padded to the longest text, plus
 * `token_type_ids` when `inputNames` lists it. With `buffers`, the tensors are built
 * into them and allocate nothing (valid until the next batch built into them: pass
 * them straight to `pool.run`).
 *
 * ## Example
 * ```ts
 * const buffers = new FeedBuffers();
 * infer({ pool, toFeeds: (batch) => textFeeds(tokenizer, batch.items, undefined, buffers), fromOutputs: (o) => tensorRows(o.embeddings!), maxBatch: 32, maxWait: 5 });
 * ```
 */
export function textFeeds(
  tokenizer: Tokenizer,
  texts: readonly string[],
  inputNames: readonly string[] = ['input_ids', 'attention_mask'],
  buffers?: FeedBuffers,
): Feeds {
  const encoded = tokenizer.encodeBatch(texts, buffers);
  const dims = [...encoded.shape];
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ortRuntime.Tensor('int64', encoded.inputIds, dims),
    attention_mask: new ortRuntime.Tensor('int64', encoded.attentionMask, dims),
  };
  if (inputNames.includes('token_type_ids')) feeds.token_type_ids = new ortRuntime.Tensor('int64', encoded.tokenTypeIds, dims);
  return feeds;
}

/**
 * The rows of a `[batch, width]` float32 tensor, as views into its data (no copy;
 * the buffer was transferred from the worker and belongs to the caller alone).
 *
 * ## Example
 * ```ts
 * const vectors = tensorRows((await pool.run(feeds)).embeddings!); // one Float32Array per text
 * ```
 */
export function tensorRows(tensor: ort.Tensor): Float32Array[] {
  if (tensor.type !== 'float32' || tensor.dims.length !== 2) {
    throw new TypeError(`expected a [batch, width] float32 tensor, got ${tensor.type} [${tensor.dims.join(', ')}]`);
  }
  const [rows, width] = tensor.dims as [number, number];
  const data = tensor.data as Float32Array;
  return Array.from({ length: rows }, (_, i) => data.subarray(i * width, (i + 1) * width));
}

/** Options of `embedder`: the model to run (in a pool of several) and the pooling. */
export interface PoolEmbedderOptions extends PoolingOptions {
  /** The pool's model to run. Default: the pool's only model. */
  model?: string;
}

const embedderSchema = lazySchema((z) =>
  z.strictObject({
    model: z.string({ error: 'model must be a string' }).min(1, { error: 'model must not be empty' }).optional(),
    output: z.string({ error: 'output must be a string' }).min(1, { error: 'output must not be empty' }).optional(),
    pooling: z.enum(['none', 'mean', 'cls'], { error: "pooling must be 'none', 'mean' or 'cls'" }).optional(),
    normalize: z.boolean({ error: 'normalize must be a boolean' }).optional(),
  }),
);

/**
 * An embedder over an `InferencePool` for a text embedding model (such as the
 * generated `embed.onnx`, or an all-MiniLM-L6-v2 export): one pool run per call,
 * all texts in one padded batch, one vector per text, in order. The signal aborts
 * the pool job (queued: never runs; running: its result is dropped).
 *
 * It has the shape `embed({ embedder })` and `SemanticCache` accept.
 *
 * **Your own sentence-transformer export.** It is fed `input_ids`, `attention_mask`
 * and, when the model declares it, `token_type_ids` (zeros). The output and its
 * pooling are chosen from the model's output names unless `output`, `pooling` and
 * `normalize` say otherwise:
 *
 * | the model outputs | read | pooling | normalize |
 * |---|---|---|---|
 * | `embeddings` or `sentence_embedding` [batch, dim] | it | `'none'` | `false` (already done in the graph) |
 * | only `last_hidden_state` or `token_embeddings` [batch, seq, dim] | it | `'mean'` over the positions `attention_mask` keeps | `true` (L2) |
 *
 * `pooling: 'cls'` takes the first position's vector instead (BERT-style [CLS]
 * models); `pooler_output` is never picked automatically (it is BERT's trained
 * pooler, not a sentence embedding) but `output: 'pooler_output'` reads it. Pooling
 * runs in the worker thread right after `session.run`, so the token vectors never
 * cross back and the event loop only receives `[batch, dim]`. A model with none of
 * these outputs, or an `output` it does not have, throws `ModelSignatureError` here,
 * at construction, naming the outputs the model has.
 *
 * ## Example
 * ```ts
 * const pool = await InferencePool.create({ model: 'all-MiniLM-L6-v2/onnx/model.onnx' });
 * const tokenizer = await loadTokenizer('all-MiniLM-L6-v2/tokenizer.json');
 * // last_hidden_state → masked mean → L2 norm, as sentence-transformers computes it.
 * questions.pipe(embed({ embedder: embedder(pool, tokenizer), concurrency: pool.size }));
 * ```
 */
export function embedder(
  pool: InferencePool,
  tokenizer: Tokenizer,
  options: PoolEmbedderOptions = {},
): (texts: readonly string[], signal?: AbortSignal) => Promise<Float32Array[]> {
  parseOptions(embedderSchema(), options, 'embedder options');
  const { model, ...poolingOptions } = options;
  const info = pool.describe(model);
  const plan = planPooling(info.outputNames, poolingOptions, `model "${model ?? pool.models[0]}" of inference pool "${pool.name}"`);
  const buffers = new FeedBuffers(); // refilled per call: `pool.run` has copied them when it returns
  return async (texts, signal) => {
    if (texts.length === 0) return [];
    const outputs = await pool.run(textFeeds(tokenizer, texts, info.inputNames, buffers), { signal, model, pooling: plan });
    return tensorRows(outputs.embeddings!);
  };
}
