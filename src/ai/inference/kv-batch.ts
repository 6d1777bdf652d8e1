/**
 * Decode steps of a KV-cache decoder batched across generations (`StepBatcher`): steps whose
 * caches have one length run as one call, caches stacked on the batch axis, no padding (each row
 * computes what it would alone); with `lengthBucket`, shorter caches are left-padded and masked. A call's output cache stays stacked: generations that step
 * together again are fed it as it is, with no copy on this thread; one that steps with others, or
 * alone, has its rows copied out then (a pool transfers its feeds, so rows are never shared).
 */
import type * as ort from 'onnxruntime-node';
import { float32, int64, lastRow } from './lm-tensors.js';
import { StepBatcher, type StepBatcherOptions } from './step-batcher.js';
import type { DecoderShape, RunModel } from './lm-tensors.js';

/** Caches of `size` generations stacked, each `length` positions (a row's first `pad` of them padding): one call's output. */
interface StackedCache {
  readonly tensors: Record<string, ort.Tensor>;
  readonly size: number;
  readonly length: number;
}

/** A generation's cache: its own tensors (`past_key_values.N.*`), or its row of a stacked one. */
export type KvCache = Record<string, ort.Tensor> | StackedRow;

/** A generation's row of a stacked cache: its own positions come after `pad` masked ones. */
interface StackedRow {
  readonly stacked: StackedCache;
  readonly row: number;
  readonly pad: number;
}

/** Batching of a KV-cache decoder's steps: `StepBatcher`'s options, how far cache lengths in one call may differ, and its tokens. */
export interface DecoderBatchOptions extends StepBatcherOptions {
  /**
   * Tokens one call feeds at most, prefills included (a prompt longer than this runs alone): a long
   * prefill joining does not stall the decode steps of the others for more than this many tokens' work.
   * Default 2,048.
   */
  readonly tokenBudget?: number;
  /**
   * Cache lengths `[k·n, (k+1)·n)` share a call, shorter ones left-padded and masked: such rows may differ
   * from their lone run in the last bits (reductions over a longer row). Default 1: one length per call, exact.
   */
  readonly lengthBucket?: number;
}

/** One step of a cached generation: its prompt (a prefill, over an empty cache) or its next token. */
export interface CachedStep {
  readonly past: KvCache;
  /** The tokens fed: one for a decode step, the prompt for a prefill. */
  readonly ids: readonly number[];
  /** The first fed token's position: the cache's length. */
  readonly position: number;
}

/** What a step gives: the cache one position longer, and the next token's logits. */
export interface CachedResult {
  readonly past: KvCache;
  readonly logits: Float32Array;
}

function isRow(cache: KvCache): cache is StackedRow {
  return 'stacked' in cache && typeof (cache as { row?: unknown }).row === 'number';
}

/** A step's `present.N.*` as the next step's `past_key_values.N.*`. */
export function presentAsPast(out: Record<string, ort.Tensor>, layers: number): Record<string, ort.Tensor> {
  const next: Record<string, ort.Tensor> = {};
  for (let l = 0; l < layers; l++) {
    next[`past_key_values.${l}.key`] = out[`present.${l}.key`]!;
    next[`past_key_values.${l}.value`] = out[`present.${l}.value`]!;
  }
  return next;
}

/** Bytes a generation's cache weighs (its share of a stacked one). */
export function kvBytes(cache: KvCache): number {
  const tensors = isRow(cache) ? cache.stacked.tensors : cache;
  let bytes = 0;
  for (const tensor of Object.values(tensors)) bytes += (tensor.data as Float32Array).byteLength;
  return isRow(cache) ? bytes / cache.stacked.size : bytes;
}

/** A generation's own copy of its cache, for a step that runs it alone or unbatched. */
export function ownCache(cache: KvCache, shape: DecoderShape): Record<string, ort.Tensor> {
  if (!isRow(cache)) return cache;
  const { stacked, row, pad } = cache;
  const size = shape.heads * stacked.length * shape.headDim;
  const own: Record<string, ort.Tensor> = {};
  for (const [name, tensor] of Object.entries(stacked.tensors)) {
    const data = (tensor.data as Float32Array).subarray(row * size, (row + 1) * size);
    own[name] = float32(pad === 0 ? data.slice() : movePositions(data, shape, stacked.length, pad, 0), [1, shape.heads, stacked.length - pad, shape.headDim]);
  }
  return own;
}

/** The batcher of a decoder's steps: prefills of one prompt length together, decode steps together. */
export function kvBatcher(shape: DecoderShape, run: RunModel, options: DecoderBatchOptions): StepBatcher<CachedStep, CachedResult> {
  const { lengthBucket: bucket = 1, tokenBudget = 2048, ...rest } = options;
  // A batch is shared: no one generation's signal may abort it (a cancelled one leaves before its call).
  const never = new AbortController().signal;
  const names = Array.from({ length: shape.layers }, (_, l) => [`past_key_values.${l}.key`, `past_key_values.${l}.value`]).flat();
  const stackedFeeds = (steps: readonly CachedStep[], length: number): Record<string, ort.Tensor> => {
    const first = steps[0]!.past;
    if (steps.length === 1 && !isRow(first)) return first;
    // The same generations, in the same order, as the call before: its output is this call's input.
    if (
      isRow(first) &&
      first.stacked.size === steps.length &&
      first.stacked.length === length &&
      steps.every((s, i) => isRow(s.past) && s.past.stacked === first.stacked && s.past.row === i)
    )
      return first.stacked.tensors;
    const feeds: Record<string, ort.Tensor> = {};
    const size = shape.heads * length * shape.headDim;
    for (const name of names) {
      const stacked = new Float32Array(steps.length * size);
      steps.forEach((s, i) => {
        const cache = s.past;
        const data = (isRow(cache) ? cache.stacked.tensors[name]! : cache[name]!).data as Float32Array;
        const from = isRow(cache) ? cache.stacked.length : s.position;
        const own = isRow(cache) ? data.subarray(cache.row * from * shape.heads * shape.headDim, (cache.row + 1) * from * shape.heads * shape.headDim) : data;
        const pad = isRow(cache) ? cache.pad : 0;
        if (from === length && pad === 0) stacked.set(own, i * size);
        else stacked.set(movePositions(own, shape, from, pad, length - s.position), i * size);
      });
      feeds[name] = float32(stacked, [steps.length, shape.heads, length, shape.headDim]);
    }
    return feeds;
  };
  return new StepBatcher<CachedStep, CachedResult>(
    async (steps) => {
      const b = steps.length;
      // One call feeds every row the same number of tokens (the key sees to it).
      const fed = steps[0]!.ids.length;
      const length = Math.max(...steps.map((s) => s.position));
      const out = await run(
        {
          ...stackedFeeds(steps, length),
          input_ids: int64(
            steps.flatMap((s) => s.ids),
            [b, fed],
          ),
          // Left padding: a row's cache ends where the longest one does; its pad positions are masked out.
          attention_mask: int64(
            steps.flatMap((s) => [...new Array<number>(length - s.position).fill(0), ...new Array<number>(s.position + fed).fill(1)]),
            [b, length + fed],
          ),
          position_ids: int64(
            steps.flatMap((s) => s.ids.map((_, j) => s.position + j)),
            [b, fed],
          ),
        },
        never,
      );
      const stacked: StackedCache = { tensors: presentAsPast(out, shape.layers), size: b, length: length + fed };
      const logits = out.logits!;
      const vocab = logits.dims[2]!;
      const seq = logits.dims[1]!;
      return steps.map((s, i) => ({
        past: b === 1 ? stacked.tensors : { stacked, row: i, pad: length - s.position },
        logits: b === 1 ? lastRow(logits) : (logits.data as Float32Array).slice(((i + 1) * seq - 1) * vocab, (i + 1) * seq * vocab),
      }));
    },
    // Decode steps by cache length (bucketed); a prefill only with prefills of its length over caches of one length.
    (step) => (step.ids.length === 1 ? String(Math.floor(step.position / bucket)) : `${step.ids.length}@${step.position}`),
    { ...rest, weight: (step) => step.ids.length, maxWeight: tokenBudget },
  );
}

/** A `[heads, from, headDim]` cache whose first `pad` positions are padding, as `[heads, from − pad + to, headDim]` after `to` zero positions. */
function movePositions(data: Float32Array, shape: DecoderShape, from: number, pad: number, to: number): Float32Array {
  const rows = (from - pad) * shape.headDim;
  const out = new Float32Array(shape.heads * (to * shape.headDim + rows));
  for (let h = 0; h < shape.heads; h++) {
    const start = h * from * shape.headDim + pad * shape.headDim;
    out.set(data.subarray(start, start + rows), h * (to * shape.headDim + rows) + to * shape.headDim);
  }
  return out;
}
