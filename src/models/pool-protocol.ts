import type { Tensor } from 'onnxruntime-node';
import type { PoolingPlan } from './pooling.js';

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
}

export interface ModelInfo {
  readonly inputNames: readonly string[];
  readonly outputNames: readonly string[];
}

export type ToWorker =
  /** With `pooling`, the worker answers `{ embeddings }` alone: token vectors never cross back. */
  | { readonly type: 'run'; readonly id: number; readonly model: string; readonly feeds: WireTensors; readonly pooling?: PoolingPlan }
  | { readonly type: 'close' };

export type FromWorker =
  | { readonly type: 'ready'; readonly models: Record<string, ModelInfo> }
  | { readonly type: 'init-failed'; readonly model: string; readonly message: string }
  /** `runs` counts every `session.run` this worker started: the pool's proof of what actually ran. */
  | { readonly type: 'done'; readonly id: number; readonly outputs: WireTensors; readonly runs: number }
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
export function fromWire(ort: { Tensor: new (type: Tensor.Type, data: Tensor.DataType, dims: readonly number[]) => Tensor }, wire: WireTensors): Record<string, Tensor> {
  const tensors: Record<string, Tensor> = {};
  for (const [name, t] of Object.entries(wire)) tensors[name] = new ort.Tensor(t.type, t.data, t.dims);
  return tensors;
}

/** The first line of an error's message: onnxruntime appends long stack-like detail. */
export function firstLine(error: unknown): string {
  const message = error instanceof Error ? error.message : String(error);
  return message.split('\n')[0] ?? message;
}
