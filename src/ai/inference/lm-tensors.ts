/** What a language model's steps are fed and read: token ids as int64, the last position's logits, the model call and its cache's shape. */
import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';

const ortRuntime = onnxruntime();

/** `values` as an int64 tensor of `dims`. */
export const int64 = (values: readonly number[], dims: readonly number[]): ort.Tensor =>
  new ortRuntime.Tensor(
    'int64',
    BigInt64Array.from(values, (v) => BigInt(v)),
    [...dims],
  );

/** The logits of the last position of the first row of `[batch, seq, vocab]` (a view). */
export function lastRow(logits: ort.Tensor): Float32Array {
  const dims = logits.dims;
  const seq = dims[1]!;
  const vocab = dims[2]!;
  return (logits.data as Float32Array).subarray((seq - 1) * vocab, seq * vocab);
}

/** A float32 tensor over `data`. */
export const float32 = (data: Float32Array, dims: readonly number[]): ort.Tensor => new ortRuntime.Tensor('float32', data, [...dims]);

/** Runs the model once. `signal` is for runners that can drop queued work (a pool); a running session ignores it. */
export type RunModel = (feeds: Record<string, ort.Tensor>, signal: AbortSignal) => Promise<Record<string, ort.Tensor>>;

/** The shape of a decoder's KV cache. */
export interface DecoderShape {
  readonly layers: number;
  readonly heads: number;
  readonly headDim: number;
  /** Positions the model can embed; a generation reaching it ends with `length`. */
  readonly maxPositions?: number;
}
