/**
 * The entry of one `InferencePool` worker thread: creates one onnxruntime session
 * per model once, then runs jobs one at a time until told to close. Runs are
 * serial on purpose: `session.run` occupies this thread anyway, and keeping the
 * queue on the pool's side is what lets a queued job be cancelled.
 */
import { readlinkSync } from 'node:fs';
import { getPriority, setPriority } from 'node:os';
import { parentPort, workerData } from 'node:worker_threads';
import * as ort from 'onnxruntime-node';
import { poolOutputs } from '../models/pooling.js';
import { ResidentCaches } from './resident-kv.js';
import {
  firstLine,
  fromWire,
  intoArena,
  toWire,
  type FromWorker,
  type ModelInfo,
  type ToWorker,
  type WireTensor,
  type WireTensors,
  type WorkerInit,
} from './protocol.js';

if (parentPort === null) throw new Error('worker-thread must be started as a worker thread by InferencePool');
const port = parentPort;

const init = workerData as WorkerInit;
const sessions = new Map<string, ort.InferenceSession>();
let runs = 0;
/** Where borrowed runs' outputs go (see `InferencePool.runBorrowed`); the pool sends it with the first one. */
let arena: SharedArrayBuffer | undefined;

const post = (message: FromWorker, transfer: ArrayBuffer[] = []): void => {
  try {
    port.postMessage(message, transfer);
  } catch {
    // A buffer onnxruntime does not let go of (external memory) cannot be transferred: copy instead.
    port.postMessage(message);
  }
};

/** Lowers this thread's priority by `niceness` below the process's (Linux: `nice` is per thread, and threads started later inherit it). */
function yieldPriority(niceness: number): void {
  if (niceness === 0 || process.platform !== 'linux') return;
  try {
    const tid = Number(readlinkSync('/proc/thread-self').split('/').at(-1));
    if (Number.isInteger(tid)) setPriority(tid, Math.min(19, getPriority(tid) + niceness));
  } catch {
    // No /proc, or not permitted: the thread keeps the process's priority.
  }
}

async function start(): Promise<void> {
  yieldPriority(init.niceness);
  const models: Record<string, ModelInfo> = {};
  for (const [name, source] of Object.entries(init.models)) {
    try {
      const options: ort.InferenceSession.SessionOptions = { executionProviders: ['cpu'], executionMode: 'sequential', ...init.sessionOptions };
      const session = typeof source === 'string' ? await ort.InferenceSession.create(source, options) : await ort.InferenceSession.create(source, options);
      sessions.set(name, session);
      models[name] = { inputNames: [...session.inputNames], outputNames: [...session.outputNames] };
    } catch (error) {
      await release();
      post({ type: 'init-failed', model: name, message: firstLine(error) });
      port.close();
      return;
    }
  }
  port.on('message', (message: ToWorker) => enqueue(() => handle(message)));
  post({ type: 'ready', models });
}

/** One task at a time: a release must not land in the middle of a step over the caches it frees. */
let turn: Promise<void> = Promise.resolve();
const enqueue = (task: () => Promise<void> | void): void => {
  // A task that throws is a bug in this thread: it crashes the thread (the pool reports it) rather than stall the queue.
  turn = turn.then(task).catch((error: unknown) => {
    setImmediate(() => {
      throw error;
    });
  });
};

const caches = new ResidentCaches();
const held = (): void => post({ type: 'kv-held', ...caches.held });

async function handle(message: ToWorker): Promise<void> {
  if (message.type === 'close') {
    await release();
    port.close(); // the last handle: the thread exits once the port is closed
    return;
  }
  if (message.type === 'kv-release') {
    // Rows left behind are copied out on a later turn: a step already posted may take them along first.
    if (caches.release(message.sequences))
      setImmediate(() =>
        enqueue(() => {
          caches.compact();
          held();
        }),
      );
    held();
    return;
  }
  const session = sessions.get(message.model);
  runs++;
  try {
    if (session === undefined) throw new Error(`no model "${message.model}" in this worker`);
    if (message.type === 'kv-step') {
      const logits = await caches.step(session, message.step);
      held();
      post({ type: 'done', id: message.id, outputs: { logits: { type: 'float32', data: logits.data, dims: logits.dims } }, runs }, [
        (logits.data as Float32Array).buffer as ArrayBuffer,
      ]);
      return;
    }
    if (message.arena !== undefined) arena = message.arena;
    const feeds = fromWire(ort, localize(message.feeds));
    const raw = await session.run(feeds);
    // Pooling here keeps the O(batch × seq × dim) loop off the caller's event loop.
    const outputs = message.pooling === undefined ? raw : poolOutputs(raw, feeds, message.pooling);
    // The pool reads a borrowed run's outputs before it sends this thread another job, so the arena is free now.
    const placed = message.borrow === true && arena !== undefined ? intoArena(outputs, arena) : undefined;
    if (placed !== undefined) {
      post({ type: 'done-in-arena', id: message.id, outputs: placed, runs });
      return;
    }
    const wire = toWire(outputs, true);
    post({ type: 'done', id: message.id, outputs: wire.tensors, runs }, wire.transfer);
  } catch (error) {
    post({ type: 'run-failed', id: message.id, message: firstLine(error), runs });
  }
}

/** Per input name, a buffer this thread reuses for feeds that arrive in shared memory. */
const local = new Map<string, WireTensor['data']>();

/**
 * Feeds in shared memory (`FeedBuffers`) are copied into this thread's own reused
 * buffers: onnxruntime refuses a SharedArrayBuffer, and the owner refills the shared
 * one as soon as this run is answered.
 */
function localize(feeds: WireTensors): WireTensors {
  let out: Record<string, WireTensor> | undefined;
  for (const [name, tensor] of Object.entries(feeds)) {
    const data = tensor.data;
    if (!ArrayBuffer.isView(data) || !(data.buffer instanceof SharedArrayBuffer)) continue;
    const shared = data as unknown as BigInt64Array; // any typed array: only length, set and subarray are used
    let buffer = local.get(name) as unknown as BigInt64Array | undefined;
    if (buffer === undefined || buffer.constructor !== shared.constructor || buffer.length < shared.length) {
      buffer = new (shared.constructor as BigInt64ArrayConstructor)(shared.length);
      local.set(name, buffer as unknown as WireTensor['data']);
    }
    const view = buffer.length === shared.length ? buffer : buffer.subarray(0, shared.length);
    view.set(shared);
    (out ??= { ...feeds })[name] = { ...tensor, data: view as unknown as WireTensor['data'] };
  }
  return out ?? feeds;
}

async function release(): Promise<void> {
  for (const session of sessions.values()) await session.release().catch(() => undefined);
  sessions.clear();
}

void start();
