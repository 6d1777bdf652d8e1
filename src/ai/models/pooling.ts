/**
 * From an embedding model's outputs to one vector per text. sluice's generated model
 * pools inside the graph (`embeddings`); sentence-transformer exports from optimum or
 * the Hugging Face hub (all-MiniLM-L6-v2, …) usually stop at the token vectors
 * (`last_hidden_state` [batch, seq, dim]) and leave pooling to the caller.
 */
import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';
import { ModelSignatureError } from './errors.js';

const ortRuntime = onnxruntime();

/**
 * How token vectors become one vector per text: `'none'` (the output already has one
 * per text), `'mean'` (average of the positions `attention_mask` keeps) or `'cls'` (the
 * first position's vector).
 */
export type Pooling = 'none' | 'mean' | 'cls';

/** How token vectors become one vector per text: the output to read, the pooling and whether to normalise. */
export interface PoolingOptions {
  /**
   * The output to read. Default: the first of `embeddings`, `sentence_embedding` (one
   * vector per text), `last_hidden_state`, `token_embeddings` (one per token) that the
   * model has; with `pooling` `'none'` only the first two, with `'mean'`/`'cls'` only the last two.
   */
  output?: string;
  /** Default: `'mean'` for a token-level output (`last_hidden_state`, `token_embeddings`), else `'none'`. */
  pooling?: Pooling;
  /** L2-normalise each vector (what sentence-transformers does for cosine search). Default: `true` unless `pooling` is `'none'`. */
  normalize?: boolean;
}

/** Resolved pooling: which output, how to pool it, whether to L2-normalise. Plain data, so it can travel to a pool worker. */
export interface PoolingPlan {
  readonly output: string;
  readonly pooling: Pooling;
  readonly normalize: boolean;
}

/** Outputs with one vector per text, in the order the automatic choice prefers them. */
export const TEXT_OUTPUTS: readonly string[] = ['embeddings', 'sentence_embedding'];
/** Outputs with one vector per token, to be pooled. */
export const TOKEN_OUTPUTS: readonly string[] = ['last_hidden_state', 'token_embeddings'];

const quoted = (names: readonly string[]): string => names.map((n) => `"${n}"`).join(', ') || 'none';

/** The problem with `outputNames` for an embedding adapter, or `undefined` when one of them fits. */
export function embeddingOutputProblem(outputNames: readonly string[]): string | undefined {
  if (outputNames.some((n) => TEXT_OUTPUTS.includes(n) || TOKEN_OUTPUTS.includes(n))) return undefined;
  return (
    `no output to take embeddings from: expected ${quoted(TEXT_OUTPUTS)} [batch, dim] or ${quoted(TOKEN_OUTPUTS)} [batch, seq, dim]; ` +
    `the model's outputs are ${quoted(outputNames)}`
  );
}

/**
 * Picks the output and pooling for a model with `outputNames` (see `PoolingOptions` for
 * the defaults). Throws `ModelSignatureError` naming the outputs the model has when none fits;
 * `source` names the model in it (a path, or which model of which pool).
 */
export function planPooling(outputNames: readonly string[], options: PoolingOptions = {}, source = '<model>'): PoolingPlan {
  const fail = (problem: string): never => {
    throw new ModelSignatureError(
      source,
      'embedding',
      [problem],
      'Pass `output` naming the output that holds the embeddings, and `pooling` if it holds one vector per token.',
    );
  };
  let output = options.output;
  if (output === undefined) {
    const candidates = options.pooling === undefined ? [...TEXT_OUTPUTS, ...TOKEN_OUTPUTS] : options.pooling === 'none' ? TEXT_OUTPUTS : TOKEN_OUTPUTS;
    output = candidates.find((name) => outputNames.includes(name));
    if (output === undefined) {
      return fail(
        options.pooling === undefined
          ? embeddingOutputProblem(outputNames)!
          : `pooling "${options.pooling}" reads one of ${quoted(candidates)}; the model's outputs are ${quoted(outputNames)}`,
      );
    }
  } else if (!outputNames.includes(output)) {
    return fail(`no output "${output}"; the model's outputs are ${quoted(outputNames)}`);
  }
  const pooling = options.pooling ?? (TOKEN_OUTPUTS.includes(output) ? 'mean' : 'none');
  return { output, pooling, normalize: options.normalize ?? pooling !== 'none' };
}

/**
 * Applies `plan` to a run's outputs: `{ embeddings }` as a `[batch, dim]` float32 tensor.
 * `feeds.attention_mask` says which positions `'mean'` averages (all of them when absent).
 * Throws a `TypeError` when the output is missing or has the wrong type or rank for the pooling.
 *
 * ## Example
 * ```ts
 * const model = await loadModel('all-MiniLM-L6-v2/model.onnx', { signature: SIGNATURES.embedding });
 * const feeds = textFeeds(tokenizer, texts, model.inputNames);
 * const { embeddings } = poolOutputs(await model.run(feeds), feeds, planPooling(model.outputNames));
 * ```
 */
export function poolOutputs(
  outputs: Readonly<Record<string, ort.Tensor>>,
  feeds: Readonly<Record<string, ort.Tensor>>,
  plan: PoolingPlan,
): { embeddings: ort.Tensor } {
  const tensor = outputs[plan.output];
  if (tensor === undefined) throw new TypeError(`the model returned no output "${plan.output}" (it returned ${quoted(Object.keys(outputs))})`);
  const shape = `${tensor.type} [${tensor.dims.join(', ')}]`;
  if (tensor.type !== 'float32') throw new TypeError(`output "${plan.output}" is ${shape}; pooling reads float32`);
  const rank = plan.pooling === 'none' ? 2 : 3;
  if (tensor.dims.length !== rank) {
    const expected = rank === 2 ? `[batch, dim] for pooling "none" (token vectors need "mean" or "cls")` : `[batch, seq, dim] for pooling "${plan.pooling}"`;
    throw new TypeError(`output "${plan.output}" is ${shape}; expected ${expected}`);
  }
  const mask = feeds.attention_mask?.data;
  const data = poolVectors(tensor.data as Float32Array, tensor.dims, mask instanceof BigInt64Array ? mask : undefined, plan);
  return { embeddings: new ortRuntime.Tensor('float32', data, [tensor.dims[0]!, tensor.dims[rank - 1]!]) };
}

/** The pooled `[batch, dim]` data of `values` (`[batch, dim]` or `[batch, seq, dim]`), summed in float64. */
function poolVectors(values: Float32Array, dims: readonly number[], mask: BigInt64Array | undefined, plan: PoolingPlan): Float32Array {
  const batch = dims[0]!;
  const seq = dims.length === 3 ? dims[1]! : 1;
  const dim = dims[dims.length - 1]!;
  if (plan.pooling === 'none' && !plan.normalize) return values;
  if (plan.pooling === 'mean' && mask !== undefined && mask.length !== batch * seq) {
    throw new TypeError(`attention_mask has ${mask.length} entries; output "${plan.output}" is [${dims.join(', ')}]`);
  }
  const out = new Float32Array(batch * dim);
  const sum = new Float64Array(dim);
  for (let row = 0; row < batch; row++) {
    sum.fill(0);
    // 'cls' and 'none' read one position; 'mean' every position the mask keeps.
    const positions = plan.pooling === 'mean' ? seq : 1;
    let count = 0;
    for (let position = 0; position < positions; position++) {
      if (plan.pooling === 'mean' && mask !== undefined && mask[row * seq + position] === 0n) continue;
      count++;
      const offset = (row * seq + position) * dim;
      for (let d = 0; d < dim; d++) sum[d]! += values[offset + d]!;
    }
    // sentence-transformers' floors: a row with no kept position pools to zero, not NaN.
    const scale = 1 / Math.max(count, 1e-9);
    let norm = 0;
    for (let d = 0; d < dim; d++) norm += (sum[d]! * scale) ** 2;
    const divisor = plan.normalize ? Math.max(Math.sqrt(norm), 1e-12) : 1;
    for (let d = 0; d < dim; d++) out[row * dim + d] = (sum[d]! * scale) / divisor;
  }
  return out;
}
