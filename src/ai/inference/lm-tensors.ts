/** What a language model's steps are fed and read: token ids as int64, the last position's logits, the model call and its cache's shape. */
import type * as ort from 'onnxruntime-node';
import { rowLogits, type KvShape } from '../pool/kv-stack.js';

export { float32, int64 } from '../pool/kv-stack.js';

/** The logits of the last position of the first row of `[batch, seq, vocab]` (a view). */
export function lastRow(logits: ort.Tensor): Float32Array {
  return rowLogits(logits, 0);
}

/** Runs the model once. `signal` is for runners that can drop queued work (a pool); a running session ignores it. */
export type RunModel = (feeds: Record<string, ort.Tensor>, signal: AbortSignal) => Promise<Record<string, ort.Tensor>>;

/** The shape of a decoder's KV cache. */
export interface DecoderShape extends KvShape {
  /** Positions the model can embed; a generation reaching it ends with `length`. */
  readonly maxPositions?: number;
}
