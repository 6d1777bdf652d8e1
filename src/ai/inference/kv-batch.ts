/**
 * Decode steps of a KV-cache decoder batched across generations (`StepBatcher`): steps whose
 * caches have one length run as one call, caches stacked on the batch axis, no padding (each row
 * computes what it would alone). A call's output cache stays stacked: generations that step
 * together again are fed it as it is, with no copy on this thread; one that steps with others, or
 * alone, has its rows copied out then (a pool transfers its feeds, so rows are never shared).
 */
import type * as ort from 'onnxruntime-node';
import { float32, int64, lastRow } from './lm-tensors.js';
import { StepBatcher, type StepBatcherOptions } from './step-batcher.js';
import type { DecoderShape, RunModel } from './lm-tensors.js';

/** Caches of `size` generations stacked, each `length` positions: one call's output. */
interface StackedCache {
  readonly tensors: Record<string, ort.Tensor>;
  readonly size: number;
  readonly length: number;
}

/** A generation's cache: its own tensors (`past_key_values.N.*`), or its row of a stacked one. */
export type KvCache = Record<string, ort.Tensor> | { readonly stacked: StackedCache; readonly row: number };

/** One single-token decode step of a cached generation. */
export interface CachedStep {
  readonly past: KvCache;
  readonly id: number;
  /** The token's position: the cache's length. */
  readonly position: number;
}

/** What a step gives: the cache one position longer, and the next token's logits. */
export interface CachedResult {
  readonly past: KvCache;
  readonly logits: Float32Array;
}

function isRow(cache: KvCache): cache is { readonly stacked: StackedCache; readonly row: number } {
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
  const { stacked, row } = cache;
  const size = shape.heads * stacked.length * shape.headDim;
  const own: Record<string, ort.Tensor> = {};
  for (const [name, tensor] of Object.entries(stacked.tensors)) {
    own[name] = float32((tensor.data as Float32Array).slice(row * size, (row + 1) * size), [1, shape.heads, stacked.length, shape.headDim]);
  }
  return own;
}

/** The batcher of a decoder's single-token steps. */
export function kvBatcher(shape: DecoderShape, run: RunModel, options: StepBatcherOptions): StepBatcher<CachedStep, CachedResult> {
  // A batch is shared: no one generation's signal may abort it (a cancelled one leaves before its call).
  const never = new AbortController().signal;
  const names = Array.from({ length: shape.layers }, (_, l) => [`past_key_values.${l}.key`, `past_key_values.${l}.value`]).flat();
  const stackedFeeds = (steps: readonly CachedStep[], length: number): Record<string, ort.Tensor> => {
    const first = steps[0]!.past;
    if (steps.length === 1 && !isRow(first)) return first;
    // The same generations, in the same order, as the call before: its output is this call's input.
    if (isRow(first) && first.stacked.size === steps.length && steps.every((s, i) => isRow(s.past) && s.past.stacked === first.stacked && s.past.row === i))
      return first.stacked.tensors;
    const feeds: Record<string, ort.Tensor> = {};
    const size = shape.heads * length * shape.headDim;
    for (const name of names) {
      const stacked = new Float32Array(steps.length * size);
      steps.forEach((s, i) => {
        const cache = s.past;
        const data = (isRow(cache) ? cache.stacked.tensors[name]! : cache[name]!).data as Float32Array;
        stacked.set(isRow(cache) ? data.subarray(cache.row * size, (cache.row + 1) * size) : data, i * size);
      });
      feeds[name] = float32(stacked, [steps.length, shape.heads, length, shape.headDim]);
    }
    return feeds;
  };
  return new StepBatcher<CachedStep, CachedResult>(
    async (steps) => {
      const b = steps.length;
      const length = steps[0]!.position;
      const out = await run(
        {
          ...stackedFeeds(steps, length),
          input_ids: int64(
            steps.map((s) => s.id),
            [b, 1],
          ),
          attention_mask: int64(new Array<number>(b * (length + 1)).fill(1), [b, length + 1]),
          position_ids: int64(
            steps.map((s) => s.position),
            [b, 1],
          ),
        },
        never,
      );
      const stacked: StackedCache = { tensors: presentAsPast(out, shape.layers), size: b, length: length + 1 };
      const logits = out.logits!;
      const vocab = logits.dims[2]!;
      const seq = logits.dims[1]!;
      return steps.map((_, i) => ({
        past: b === 1 ? stacked.tensors : { stacked, row: i },
        logits: b === 1 ? lastRow(logits) : (logits.data as Float32Array).slice(((i + 1) * seq - 1) * vocab, (i + 1) * seq * vocab),
      }));
    },
    (step) => String(step.position),
    options,
  );
}
