/**
 * The KV caches of a decoder's generations stacked on the batch axis, and the feeds of one batched
 * step: shared by the main thread (`kvBatcher`, caches that travel with each step) and the pool's
 * worker threads (`ResidentCaches`, caches that stay where they were computed). A step's output
 * cache stays stacked: generations that step together again are fed it as it is, with no copy.
 */
import type * as ort from 'onnxruntime-node';
import { onnxruntime } from '../../core/peers.js';

const ortRuntime = onnxruntime();

/** The shape of a decoder's KV cache: `[batch, heads, positions, headDim]` per layer, key and value. */
export interface KvShape {
  readonly layers: number;
  readonly heads: number;
  readonly headDim: number;
}

/** Caches of `size` generations stacked, each `length` positions (a row's first `pad` of them padding): one call's output. */
export interface StackedCache {
  readonly tensors: Record<string, ort.Tensor>;
  readonly size: number;
  readonly length: number;
}

/** A generation's row of a stacked cache: its own positions come after `pad` masked ones. */
export interface StackedRow {
  readonly stacked: StackedCache;
  readonly row: number;
  readonly pad: number;
}

/** A generation's cache: its own tensors (`past_key_values.N.*`), or its row of a stacked one. */
export type KvCache = Record<string, ort.Tensor> | StackedRow;

/** One row of a batched step: its cache (none for a prompt's first step), the tokens fed, and the position of the first. */
export interface KvStepRow {
  readonly past: KvCache | undefined;
  readonly ids: readonly number[];
  /** The first fed token's position: the cache's length. */
  readonly position: number;
}

/** `values` as an int64 tensor of `dims`. */
export const int64 = (values: readonly number[], dims: readonly number[]): ort.Tensor =>
  new ortRuntime.Tensor(
    'int64',
    BigInt64Array.from(values, (v) => BigInt(v)),
    [...dims],
  );

/** A float32 tensor over `data`. */
export const float32 = (data: Float32Array, dims: readonly number[]): ort.Tensor => new ortRuntime.Tensor('float32', data, [...dims]);

/** Whether `cache` is a row of a stacked cache. */
export function isRow(cache: KvCache): cache is StackedRow {
  return 'stacked' in cache && typeof (cache as { row?: unknown }).row === 'number';
}

/** The cache input names, layer by layer, key then value. */
export function pastNames(layers: number): string[] {
  return Array.from({ length: layers }, (_, l) => [`past_key_values.${l}.key`, `past_key_values.${l}.value`]).flat();
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
export function ownCache(cache: KvCache, shape: KvShape): Record<string, ort.Tensor> {
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

/** An empty cache (no positions), for a prompt's first step alone. */
export function emptyCache(shape: KvShape): Record<string, ort.Tensor> {
  const none: Record<string, ort.Tensor> = {};
  for (const name of pastNames(shape.layers)) none[name] = float32(new Float32Array(0), [1, shape.heads, 0, shape.headDim]);
  return none;
}

/**
 * The caches of `rows` as one `[rows, heads, length, headDim]` feed per name, each left-padded to
 * `length`; the stacked output of the call before as it is when these are its rows, in its order.
 */
export function stackCaches(rows: readonly KvStepRow[], shape: KvShape, length: number): Record<string, ort.Tensor> {
  const first = rows[0]!.past;
  if (rows.length === 1 && first !== undefined && !isRow(first)) return first;
  if (
    first !== undefined &&
    isRow(first) &&
    first.stacked.size === rows.length &&
    first.stacked.length === length &&
    rows.every((s, i) => s.past !== undefined && isRow(s.past) && s.past.stacked === first.stacked && s.past.row === i)
  )
    return first.stacked.tensors;
  const feeds: Record<string, ort.Tensor> = {};
  const size = shape.heads * length * shape.headDim;
  for (const name of pastNames(shape.layers)) {
    const stacked = new Float32Array(rows.length * size);
    rows.forEach((s, i) => {
      const cache = s.past;
      // No cache yet: all padding, and a new Float32Array is zeros already.
      if (cache === undefined || s.position === 0) return;
      const data = (isRow(cache) ? cache.stacked.tensors[name]! : cache[name]!).data as Float32Array;
      const from = isRow(cache) ? cache.stacked.length : s.position;
      const own = isRow(cache) ? data.subarray(cache.row * from * shape.heads * shape.headDim, (cache.row + 1) * from * shape.heads * shape.headDim) : data;
      const pad = isRow(cache) ? cache.pad : 0;
      if (from === length && pad === 0) stacked.set(own, i * size);
      else stacked.set(movePositions(own, shape, from, pad, length - s.position), i * size);
    });
    feeds[name] = float32(stacked, [rows.length, shape.heads, length, shape.headDim]);
  }
  return feeds;
}

/** The feeds of one batched step over caches of `length` positions: every row is fed the same number of tokens. */
export function stepFeeds(rows: readonly KvStepRow[], shape: KvShape): { feeds: Record<string, ort.Tensor>; length: number } {
  const b = rows.length;
  const fed = rows[0]!.ids.length;
  const length = Math.max(...rows.map((s) => s.position));
  const feeds = {
    ...stackCaches(rows, shape, length),
    input_ids: int64(
      rows.flatMap((s) => s.ids),
      [b, fed],
    ),
    // Left padding: a row's cache ends where the longest one does; its pad positions are masked out.
    attention_mask: int64(
      rows.flatMap((s) => [...new Array<number>(length - s.position).fill(0), ...new Array<number>(s.position + fed).fill(1)]),
      [b, length + fed],
    ),
    position_ids: int64(
      rows.flatMap((s) => s.ids.map((_, j) => s.position + j)),
      [b, fed],
    ),
  };
  return { feeds, length };
}

/** Row `row`'s logits at its last fed position, of `[batch, seq, vocab]` logits (a view). */
export function rowLogits(logits: ort.Tensor, row: number): Float32Array {
  const seq = logits.dims[1]!;
  const vocab = logits.dims[2]!;
  return (logits.data as Float32Array).subarray(((row + 1) * seq - 1) * vocab, (row + 1) * seq * vocab);
}

/** A `[heads, from, headDim]` cache whose first `pad` positions are padding, as `[heads, from − pad + to, headDim]` after `to` zero positions. */
export function movePositions(data: Float32Array, shape: KvShape, from: number, pad: number, to: number): Float32Array {
  const rows = (from - pad) * shape.headDim;
  const out = new Float32Array(shape.heads * (to * shape.headDim + rows));
  for (let h = 0; h < shape.heads; h++) {
    const start = h * from * shape.headDim + pad * shape.headDim;
    out.set(data.subarray(start, start + rows), h * (to * shape.headDim + rows) + to * shape.headDim);
  }
  return out;
}
