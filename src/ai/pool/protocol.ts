import type { Tensor } from 'onnxruntime-node';
import type { PoolingPlan } from '../models/pooling.js';
import { errorMessage } from '../../core/errors.js';
import type { ResidentStep } from './resident-kv.js';

/**
 * The messages an `InferencePool` and its worker threads exchange, and the plain
 * form tensors travel in: a Tensor instance does not survive structured clone, its
 * typed array does (and is transferred rather than copied where that is safe).
 */

/** A tensor as it crosses a thread boundary: rebuilt into an `ort.Tensor` on the other side. */
export interface WireTensor {
  readonly type: Tensor.Type;
  readonly data: Tensor.DataType;
  readonly dims: readonly number[];
}

export type WireTensors = Record<string, WireTensor>;

/** A typed array's constructor name: how an output written into the arena is viewed again. */
export type TypedArrayName =
  | 'Float32Array'
  | 'Float64Array'
  | 'Int8Array'
  | 'Uint8Array'
  | 'Int16Array'
  | 'Uint16Array'
  | 'Int32Array'
  | 'Uint32Array'
  | 'BigInt64Array'
  | 'BigUint64Array';

/** An output the worker wrote into its slot's shared arena (see `InferencePool.runBorrowed`): where, not the data. */
export interface ArenaTensor {
  readonly type: Tensor.Type;
  readonly dims: readonly number[];
  readonly array: TypedArrayName;
  /** Byte offset in the arena, a multiple of 8. */
  readonly offset: number;
  /** Elements. */
  readonly length: number;
}

/** Session options a worker applies to every session it creates. */
export interface WireSessionOptions {
  readonly intraOpNumThreads: number;
  readonly interOpNumThreads: number;
  readonly graphOptimizationLevel: 'disabled' | 'basic' | 'extended' | 'all';
}

/** What a worker is started with (`workerData`). */
export interface WorkerInit {
  /** Model name → a file path or the model's bytes. */
  readonly models: Readonly<Record<string, string | Uint8Array>>;
  readonly sessionOptions: WireSessionOptions;
  /** The thread's `nice` value, set before its sessions (and their threads) start. */
  readonly niceness: number;
}

/** What a pool's model declares: its input and output names. */
export interface ModelInfo {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
}

export type ToWorker =
  /** With `pooling`, the worker answers `{ embeddings }` alone: token vectors never cross back. */
  | {
      readonly type: 'run';
      readonly id: number;
      readonly model: string;
      readonly feeds: WireTensors;
      readonly pooling?: PoolingPlan;
      /** Write the outputs into the arena when they fit (the caller reads them before this worker's next job). */
      readonly borrow?: boolean;
      /** The arena this worker writes borrowed outputs into; sent with its first borrowed run. */
      readonly arena?: SharedArrayBuffer;
    }
  /** A decode step over the KV caches this worker holds (`ResidentCaches`): answered like a run, with `{ logits }` alone. */
  | { readonly type: 'kv-step'; readonly id: number; readonly model: string; readonly step: ResidentStep }
  /** Drop these sequences' caches; answered with `kv-held`. */
  | { readonly type: 'kv-release'; readonly sequences: readonly number[] }
  | { readonly type: 'close' };

export type FromWorker =
  /** What the worker's resident caches hold now, after a step or a release. */
  | { readonly type: 'kv-held'; readonly sequences: number; readonly bytes: number }
  | { readonly type: 'ready'; readonly models: Record<string, ModelInfo> }
  | { readonly type: 'init-failed'; readonly model: string; readonly message: string }
  /** `runs` counts every `session.run` this worker started: the pool's proof of what actually ran. */
  | { readonly type: 'done'; readonly id: number; readonly outputs: WireTensors; readonly runs: number }
  /** A borrowed run whose outputs all fit: they are in the arena, nothing crosses but their places. */
  | { readonly type: 'done-in-arena'; readonly id: number; readonly outputs: Record<string, ArenaTensor>; readonly runs: number }
  | { readonly type: 'run-failed'; readonly id: number; readonly message: string; readonly runs: number };

/**
 * The plain form of `tensors`, plus the buffers to transfer.
 *
 * - `transfer`: a typed array that covers its whole `ArrayBuffer` is transferred (the
 *   sender's copy is detached); a view into part of a larger buffer is sliced first.
 * - otherwise the structured clone copies the data when the message is posted. A view
 *   covering less than half of its buffer is sliced first (the clone would copy the
 *   whole buffer); a larger one goes as it is, so reused buffers (`FeedBuffers`) cost
 *   no allocation. With `snapshot` (the message is posted later, and the caller may
 *   refill its buffers meanwhile) every tensor is copied now.
 *
 * Shared memory is never transferred or copied.
 */
export function toWire(tensors: Readonly<Record<string, Tensor>>, transfer: boolean, snapshot = false): { tensors: WireTensors; transfer: ArrayBuffer[] } {
  const wire: WireTensors = {};
  const buffers = new Set<ArrayBuffer>();
  for (const [name, tensor] of Object.entries(tensors)) {
    let data = tensor.data;
    if (ArrayBuffer.isView(data) && data.buffer instanceof ArrayBuffer) {
      const partial = data.byteOffset !== 0 || data.byteLength !== data.buffer.byteLength;
      if (transfer) {
        if (partial) data = data.slice() as Tensor.DataType;
        buffers.add((data as ArrayBufferView).buffer as ArrayBuffer);
      } else if (snapshot || (partial && data.byteLength * 2 < data.buffer.byteLength)) {
        data = data.slice() as Tensor.DataType;
      }
    }
    wire[name] = { type: tensor.type, data, dims: tensor.dims };
  }
  // Two tensors over one buffer (e.g. views of a single allocation) must not list it twice.
  return { tensors: wire, transfer: [...buffers] };
}

/** Rebuilds `ort.Tensor`s from their plain form, without copying the data. */
export function fromWire(
  ort: { Tensor: new (type: Tensor.Type, data: Tensor.DataType, dims: readonly number[]) => Tensor },
  wire: WireTensors,
): Record<string, Tensor> {
  const tensors: Record<string, Tensor> = {};
  for (const [name, t] of Object.entries(wire)) tensors[name] = new ort.Tensor(t.type, t.data, t.dims);
  return tensors;
}

const TYPED_ARRAYS: Record<TypedArrayName, new (buffer: ArrayBufferLike, byteOffset: number, length: number) => ArrayBufferView> = {
  Float32Array,
  Float64Array,
  Int8Array,
  Uint8Array,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  BigInt64Array,
  BigUint64Array,
};

/**
 * Copies `tensors` into `arena`, each at an 8-byte aligned offset, and returns where;
 * `undefined` (nothing written) when one is not a typed array sluice knows or they do
 * not all fit.
 */
export function intoArena(tensors: Readonly<Record<string, Tensor>>, arena: SharedArrayBuffer): Record<string, ArenaTensor> | undefined {
  const placed: Record<string, ArenaTensor> = {};
  let offset = 0;
  for (const [name, tensor] of Object.entries(tensors)) {
    const data = tensor.data;
    if (!ArrayBuffer.isView(data)) return undefined;
    const array = data.constructor.name as TypedArrayName;
    if (!Object.hasOwn(TYPED_ARRAYS, array)) return undefined;
    if (offset + data.byteLength > arena.byteLength) return undefined;
    placed[name] = { type: tensor.type, dims: tensor.dims, array, offset, length: (data as unknown as { length: number }).length };
    offset += Math.ceil(data.byteLength / 8) * 8;
  }
  const bytes = new Uint8Array(arena);
  for (const [name, tensor] of Object.entries(tensors)) {
    const data = tensor.data as ArrayBufferView;
    bytes.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), placed[name]!.offset);
  }
  return placed;
}

/** `ort.Tensor`s whose data are views into `arena` (no copy): valid until the arena is written again. */
export function fromArena(
  ort: { Tensor: new (type: Tensor.Type, data: Tensor.DataType, dims: readonly number[]) => Tensor },
  arena: SharedArrayBuffer,
  placed: Readonly<Record<string, ArenaTensor>>,
): Record<string, Tensor> {
  const tensors: Record<string, Tensor> = {};
  for (const [name, t] of Object.entries(placed))
    tensors[name] = new ort.Tensor(t.type, new TYPED_ARRAYS[t.array](arena, t.offset, t.length) as Tensor.DataType, t.dims);
  return tensors;
}

/** The first line of an error's message: onnxruntime appends long stack-like detail. */
export function firstLine(error: unknown): string {
  const message = errorMessage(error);
  return message.split('\n')[0] ?? message;
}
