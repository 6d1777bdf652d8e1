/**
 * Single-token decode steps of KV-cache generations batched into one model call: caches of one
 * length (or of a `lengthBucket`, left-padded and masked by `attention_mask`) stacked on the batch
 * axis, each row's `present.N.*` cut back to its own cache.
 */
import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';
import { StepBatcher, type StepBatcherOptions } from './step-batcher.js';

const ortRuntime = onnxruntime();

/** The cache layout a batch needs: layers, and heads × head size per position. */
interface CacheShape {
  readonly layers: number;
  readonly heads: number;
  readonly headDim: number;
}

/** An int64 tensor of `values`. */
export const int64 = (values: readonly number[], dims: readonly number[]) =>
  new ortRuntime.Tensor(
    'int64',
    BigInt64Array.from(values, (v) => BigInt(v)),
    [...dims],
  );

/** The logits of the last position of the first row. */
export function lastRow(logits: ort.Tensor): Float32Array {
  const dims = logits.dims;
  const seq = dims[1]!;
  const vocab = dims[2]!;
  return (logits.data as Float32Array).subarray((seq - 1) * vocab, seq * vocab);
}

/** Batching of a KV-cache decoder's steps: `StepBatcher`'s options and how far cache lengths in one call may differ. */
export interface DecoderBatchOptions extends StepBatcherOptions {
  /**
   * Cache lengths `[k·n, (k+1)·n)` share a call, padded to the longest: rows may then differ from
   * their lone run in the last bits (reductions over a longer, shifted row). Default 1: one length per call, exact.
   */
  readonly lengthBucket?: number;
}

/** One single-token decode step of a cached generation, for a batch. */
export interface CachedStep {
  readonly past: Record<string, ort.Tensor>;
  readonly id: number;
  /** The token's position: the cache's length. */
  readonly position: number;
}

/** A batched step's result for one generation: its next cache and its last position's logits. */
export interface CachedResult {
  readonly past: Record<string, ort.Tensor>;
  readonly logits: Float32Array;
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

/** Steps whose cache lengths share a bucket run as one call: caches left-padded and stacked on the batch axis, results split back (copied: a pool may transfer buffers). */
export function cacheBatcher(
  shape: CacheShape,
  run: (feeds: Record<string, ort.Tensor>, signal: AbortSignal) => Promise<Record<string, ort.Tensor>>,
  options: DecoderBatchOptions,
): StepBatcher<CachedStep, CachedResult> {
  const { lengthBucket: bucket = 1, ...rest } = options;
  const never = new AbortController().signal;
  const names = Array.from({ length: shape.layers }, (_, l) => [`past_key_values.${l}.key`, `past_key_values.${l}.value`]).flat();
  return new StepBatcher<CachedStep, CachedResult>(
    async (steps) => {
      const b = steps.length;
      const length = Math.max(...steps.map((s) => s.position));
      // Alone in its call: its cache goes in and comes out as it is, no stacking or splitting.
      if (b === 1) {
        const step = steps[0]!;
        const out = await run(
          {
            ...step.past,
            input_ids: int64([step.id], [1, 1]),
            attention_mask: int64(new Array<number>(length + 1).fill(1), [1, length + 1]),
            position_ids: int64([length], [1, 1]),
          },
          never,
        );
        return [{ past: presentAsPast(out, shape.layers), logits: lastRow(out.logits!) }];
      }
      const feeds: Record<string, ort.Tensor> = {
        input_ids: int64(
          steps.map((s) => s.id),
          [b, 1],
        ),
        // Left padding: a row's cache ends where the longest one does; its pad positions are masked out.
        attention_mask: int64(
          steps.flatMap((s) => [...new Array<number>(length - s.position).fill(0), ...new Array<number>(s.position + 1).fill(1)]),
          [b, length + 1],
        ),
        position_ids: int64(
          steps.map((s) => s.position),
          [b, 1],
        ),
      };
      for (const name of names) {
        const size = shape.heads * length * shape.headDim;
        const stacked = new Float32Array(b * size);
        steps.forEach((s, i) => placeRows(stacked, i * size, s.past[name]!.data as Float32Array, shape, length - s.position, s.position));
        feeds[name] = new ortRuntime.Tensor('float32', stacked, [b, shape.heads, length, shape.headDim]);
      }
      const out = await run(feeds, never);
      const logits = out.logits!;
      const vocab = logits.dims[2]!;
      const size = shape.heads * (length + 1) * shape.headDim;
      return steps.map((step, i) => {
        const past: Record<string, ort.Tensor> = {};
        for (let l = 0; l < shape.layers; l++) {
          for (const part of ['key', 'value'] as const) {
            const present = out[`present.${l}.${part}`]!.data as Float32Array;
            const pad = length - step.position;
            const own = pad === 0 ? present.slice(i * size, (i + 1) * size) : unpadRows(present, i * size, shape, pad, step.position + 1);
            past[`past_key_values.${l}.${part}`] = new ortRuntime.Tensor('float32', own, [1, shape.heads, step.position + 1, shape.headDim]);
          }
        }
        const seq = logits.dims[1]!;
        const row = (logits.data as Float32Array).slice(((i + 1) * seq - 1) * vocab, (i + 1) * seq * vocab);
        return { past, logits: row };
      });
    },
    (step) => String(Math.floor(step.position / bucket)),
    rest,
  );
}

/** Copies a `[heads, rows, headDim]` cache into a padded `[heads, pad + rows, headDim]` one at `offset`, after `pad` zero rows per head. */
function placeRows(target: Float32Array, offset: number, source: Float32Array, shape: CacheShape, pad: number, rows: number): void {
  const from = rows * shape.headDim;
  const to = (pad + rows) * shape.headDim;
  for (let h = 0; h < shape.heads; h++) target.set(source.subarray(h * from, (h + 1) * from), offset + h * to + pad * shape.headDim);
}

/** The `[heads, rows, headDim]` cache of one row of a padded `[heads, pad + rows, headDim]` present at `offset`. */
function unpadRows(present: Float32Array, offset: number, shape: CacheShape, pad: number, rows: number): Float32Array {
  const to = rows * shape.headDim;
  const from = (pad + rows) * shape.headDim;
  const own = new Float32Array(shape.heads * to);
  for (let h = 0; h < shape.heads; h++) {
    const start = offset + h * from + pad * shape.headDim;
    own.set(present.subarray(start, start + to), h * to);
  }
  return own;
}
