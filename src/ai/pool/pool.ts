import type { Worker } from 'node:worker_threads';
import { onnxruntime } from '../../core/peers.js';
import { AbortedError, errorMessage } from '../../core/errors.js';
import { ModelCorruptError } from '../models/errors.js';
import { lease, release, sharedBuffers } from '../models/leases.js';
import { borrowedResultError } from './borrowed.js';
import { InferenceFailedError, PoolClosedError, PoolQueueFullError, UnknownModelError, WorkerCrashedError } from './errors.js';
import { type Job, JobQueue } from './job-queue.js';
import { poolConfig, type Feeds, type InferencePoolOptions, type Outputs, type PoolConfig, type RunOptions } from './options.js';
import { fromArena, fromWire, toWire, type FromWorker, type ModelInfo, type ToWorker, type WorkerInit } from './protocol.js';
import { Slot, startWorker, type WorkerStats } from './slot.js';
import type { ResidentStep } from './resident-kv.js';

const ortRuntime = onnxruntime();

/** A snapshot of the pool, for tests, metrics and health checks. */
export interface InferencePoolStats {
  readonly size: number;
  /** Live worker threads only: a worker leaves this list when its thread has exited. */
  readonly workers: readonly WorkerStats[];
  readonly queued: number;
  readonly running: number;
  readonly submitted: number;
  readonly completed: number;
  /** Rejected by onnxruntime or by a crash. */
  readonly failed: number;
  /** Aborted by their signal, queued or running. */
  readonly aborted: number;
  /** Running jobs whose signal aborted: they finished in the worker and their result was dropped. */
  readonly discarded: number;
  /** Turned away by `maxQueue`. */
  readonly rejected: number;
  /** Worker threads that died unexpectedly; each is replaced unless the pool is closing. */
  readonly crashed: number;
  /** Worker threads that have exited, for any reason. */
  readonly exited: number;
  readonly closed: boolean;
}

/** @internal Tests reach the worker threads through this key (e.g. to kill one); not part of the public API. */
export const poolWorkers: unique symbol = Symbol('sluice.pool.workers');

/**
 * onnxruntime sessions in a pool of worker threads, so inference never blocks the
 * event loop (`session.run` holds the thread it runs on for the whole inference:
 * microsoft/onnxruntime#19611). Each worker creates its sessions **once** and reuses
 * them, since creating and releasing sessions repeatedly leaks (#25325).
 *
 * Jobs go to an idle worker at once, else wait in a bounded FIFO queue (`maxQueue`,
 * then `PoolQueueFullError`). A job whose `signal` aborts while queued is removed and
 * never runs; one already running finishes in its worker and its result is dropped;
 * both reject with `AbortedError`. Typed arrays travel by transfer, not copy, both
 * ways, and outputs are rebuilt as `ort.Tensor`s; `runBorrowed` instead lends the
 * outputs in place, in shared memory each worker reuses (nothing to allocate per run). A worker that dies fails its job
 * with `WorkerCrashedError` and is replaced. `close()` rejects queued jobs with
 * `PoolClosedError`, lets running ones finish, releases every session and ends every
 * thread. Idle workers do not keep the process alive.
 *
 * From source the workers load TypeScript through tsx (as the tests and benches
 * run); from the compiled package they load `worker-thread.js` next to this file.
 *
 * ## Example
 * ```ts
 * const pool = await InferencePool.create({ model: 'models/embed.onnx', size: 2 });
 * const { embeddings } = await pool.run(
 *   { input_ids: new ort.Tensor('int64', ids, [1, ids.length]), attention_mask: new ort.Tensor('int64', mask, [1, ids.length]) },
 *   { signal: AbortSignal.timeout(1_000) },
 * );
 * await pool.close();
 * ```
 *
 * Bad options throw `InvalidOptionsError`; a missing model file `ModelNotFoundError`;
 * a model onnxruntime cannot load `ModelCorruptError` (from `create`, before any job).
 *
 * @see infer, the stage operator that micro-batches elements into pool runs.
 */
export class InferencePool {
  readonly name: string;
  readonly size: number;
  private readonly config: PoolConfig;
  private readonly slots = new Set<Slot>();
  private info: Record<string, ModelInfo> = {};
  private readonly queue = new JobQueue();
  private nextId = 0;
  private closing: Promise<void> | undefined;
  private counts = { submitted: 0, completed: 0, failed: 0, aborted: 0, discarded: 0, rejected: 0, crashed: 0, exited: 0 };

  private constructor(config: PoolConfig) {
    this.config = config;
    this.name = config.name;
    this.size = config.size;
  }

  /** Starts `size` workers and resolves once every one has loaded every model. */
  static async create(options: InferencePoolOptions): Promise<InferencePool> {
    const config = await poolConfig(options);
    const pool = new InferencePool(config);
    const starts = Array.from({ length: config.size }, () => pool.spawn());
    try {
      await Promise.all(starts);
    } catch (error) {
      pool.closing = Promise.resolve(); // workers exiting now are not crashes to replace
      await Promise.allSettled(starts);
      await Promise.all([...pool.slots].map((slot) => slot.worker.terminate()));
      throw error;
    }
    return pool;
  }

  /** @internal */
  [poolWorkers](): Worker[] {
    return [...this.slots].map((slot) => slot.worker);
  }

  /** The model names this pool holds. */
  get models(): readonly string[] {
    return Object.keys(this.config.models);
  }

  /** Input and output names of `model`, as onnxruntime reports them. */
  describe(model?: string): ModelInfo {
    return this.info[this.resolveModel(model)]!;
  }

  /** The pool now: its workers, their states and runs, and the queue. */
  get stats(): InferencePoolStats {
    const workers = [...this.slots].map((slot): WorkerStats => ({ threadId: slot.threadId, state: slot.state, runs: slot.runs, resident: slot.resident }));
    return {
      size: this.size,
      workers,
      queued: this.queue.length,
      running: workers.filter((w) => w.state === 'busy').length,
      ...this.counts,
      closed: this.closing !== undefined,
    };
  }

  /**
   * Runs `model` on `feeds` in a worker. Rejects with `AbortedError` (signal),
   * `PoolQueueFullError`, `PoolClosedError`, `InferenceFailedError` (onnxruntime
   * refused the feeds), `WorkerCrashedError` or `UnknownModelError`.
   *
   * Feeds in ordinary memory have been transferred (detached) or, with `transferFeeds:
   * false`, copied when `run` returns. Feeds in shared memory (`FeedBuffers`) are read in
   * place by the worker and leased until it is done with them.
   */
  run(feeds: Feeds, options: RunOptions = {}): Promise<Outputs> {
    return this.submit(feeds, options, undefined) as Promise<Outputs>;
  }

  /**
   * Runs `model` on `feeds` like `run`, but hands the outputs to `use` **in place**: the
   * worker writes them into shared memory it reuses (`outputArenaBytes`), so a run
   * allocates no output buffers on this thread — no garbage, and none of the external
   * memory that drives V8 into full collections at high output rates. The run resolves
   * to what `use` returns.
   *
   * The outputs are valid only while `use` runs: the worker's next run overwrites them.
   * So `use` must be synchronous and must copy whatever it keeps (a score, a label, an
   * argmax, `row.slice()`). It rejects with `BorrowedOutputsError` if `use` returns a
   * Promise, or a view into the borrowed memory (itself or as an element of an array);
   * an error `use` throws rejects the run. Outputs too large for the arena come in
   * fresh buffers instead, to the same `use`.
   *
   * ```ts
   * const labels = await pool.runBorrowed(feeds, ({ scores }) => argmaxRows(scores!));
   * ```
   */
  runBorrowed<R>(feeds: Feeds, use: (outputs: Outputs) => R, options: RunOptions = {}): Promise<R> {
    if (typeof use !== 'function') return Promise.reject(new TypeError('runBorrowed: use must be a function of the outputs'));
    return this.submit(feeds, options, use as (outputs: Outputs) => unknown) as Promise<R>;
  }

  /** Threads that can hold KV caches (`runResident`): every live worker's, one being replaced included. */
  get residentThreads(): readonly number[] {
    return [...this.slots].filter((slot) => slot.state !== 'closing').map((slot) => slot.threadId);
  }

  /**
   * Runs a decoder step on the worker thread `threadId` over the KV caches it holds for the step's
   * sequences, keeps their new caches there, and resolves to `{ logits }` `[rows, vocab]`: each row's
   * logits at its last fed token. Rejects like `run`, and with `WorkerCrashedError` when that thread
   * is gone (its caches with it).
   */
  runResident(threadId: number, step: ResidentStep, options: RunOptions = {}): Promise<Outputs> {
    const slot = [...this.slots].find((s) => s.threadId === threadId && s.state !== 'closing');
    if (slot === undefined && this.closing === undefined)
      return Promise.reject(new WorkerCrashedError(this.name, threadId, 'the thread is gone, and the KV caches it held with it'));
    return this.submit({}, options, undefined, slot === undefined ? undefined : { slot, step }) as Promise<Outputs>;
  }

  /** Drops the KV caches of `sequences` that the worker thread `threadId` holds; nothing when that thread is gone. */
  releaseResident(threadId: number, sequences: readonly number[]): void {
    const slot = [...this.slots].find((s) => s.threadId === threadId && s.state !== 'closing');
    slot?.worker.postMessage({ type: 'kv-release', sequences } satisfies ToWorker);
  }

  private submit(
    feeds: Feeds,
    options: RunOptions,
    use: ((outputs: Outputs) => unknown) | undefined,
    pinned?: { readonly slot: Slot; readonly step: ResidentStep },
  ): Promise<unknown> {
    if (this.closing !== undefined) return Promise.reject(new PoolClosedError(this.name, false));
    let model: string;
    try {
      model = this.resolveModel(options.model);
    } catch (error) {
      return Promise.reject(error);
    }
    const signal = options.signal;
    if (signal?.aborted) {
      this.counts.aborted++;
      return Promise.reject(this.abortError(signal, 'before it was queued'));
    }
    const idle = pinned === undefined ? this.idleSlot() : pinned.slot.state === 'idle' ? pinned.slot : undefined;
    if (idle === undefined && this.queue.length >= this.config.maxQueue) {
      this.counts.rejected++;
      return Promise.reject(new PoolQueueFullError(this.name, this.config.maxQueue));
    }
    // Queued, the message is posted later: copy now (when copying), so the caller may refill its buffers as soon as `run` returns.
    const wire = toWire(feeds, this.config.transferFeeds, idle === undefined);
    this.counts.submitted++;
    return new Promise<unknown>((resolve, reject) => {
      const leases = sharedBuffers(feeds);
      for (const buffer of leases) lease(buffer);
      const job: Job = {
        id: this.nextId++,
        model,
        feeds: wire.tensors,
        pooling: options.pooling,
        step: pinned?.step,
        pin: pinned?.slot,
        transfer: wire.transfer,
        leases,
        use,
        resolve,
        reject,
        signal,
        onAbort: undefined,
        state: 'queued',
        prev: undefined,
        next: undefined,
      };
      if (signal !== undefined) {
        job.onAbort = InferencePool.abortListener(this, job);
        signal.addEventListener('abort', job.onAbort, { once: true });
      }
      if (idle !== undefined) this.start(idle, job);
      else this.queue.push(job);
    });
  }

  /**
   * Rejects queued jobs with `PoolClosedError`, waits for running ones, releases
   * every session and ends every worker thread (terminating one that does not exit
   * within `closeTimeout`). Idempotent.
   */
  close(): Promise<void> {
    return (this.closing ??= this.shutdown());
  }

  private async shutdown(): Promise<void> {
    for (const job of this.queue.drain()) this.settle(job, 'failed', new PoolClosedError(this.name, true));
    const slots = [...this.slots];
    for (const slot of slots) if (slot.state === 'idle') this.retire(slot);
    // Busy and starting workers retire when they answer (see onMessage).
    await Promise.all(
      slots.map(async (slot) => {
        let timer: NodeJS.Timeout | undefined;
        const deadline = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), this.config.closeTimeout)));
        const outcome = await Promise.race([slot.exited, deadline]);
        clearTimeout(timer);
        if (outcome === 'late') {
          await slot.worker.terminate();
          await slot.exited;
        }
      }),
    );
  }

  // ---- workers ----

  /** Starts one worker; resolves when its sessions are ready, rejects with a typed error if they cannot be. */
  private spawn(): Promise<void> {
    const init: WorkerInit = {
      models: this.config.models,
      sessionOptions: {
        intraOpNumThreads: this.config.intraOpNumThreads,
        interOpNumThreads: this.config.interOpNumThreads,
        graphOptimizationLevel: this.config.graphOptimizationLevel,
      },
      niceness: this.config.niceness,
    };
    const slot = new Slot(startWorker(init));
    this.slots.add(slot);
    return new Promise<void>((resolve, reject) => {
      let started = false;
      slot.worker.on('message', (message: FromWorker) => {
        if (message.type === 'ready') {
          started = true;
          this.info = message.models;
          this.onReady(slot);
          resolve();
        } else if (message.type === 'init-failed') {
          const source = this.config.models[message.model]!;
          reject(
            new ModelCorruptError(
              typeof source === 'string' ? source : `<bytes of model "${message.model}">`,
              `onnxruntime rejected it as an ONNX model (${message.message}).`,
            ),
          );
        } else if (message.type === 'kv-held') {
          slot.resident = { sequences: message.sequences, bytes: message.bytes };
        } else {
          this.onAnswer(slot, message);
        }
      });
      slot.worker.on('error', (error) => (slot.lastError = error));
      slot.worker.on('messageerror', (error) => this.onAnswerLost(slot, error));
      slot.worker.on('exit', (code) => {
        const expected = slot.state === 'closing';
        this.slots.delete(slot);
        this.counts.exited++;
        slot.onExit();
        if (!started) {
          reject(slot.lastError ?? new WorkerCrashedError(this.name, slot.threadId, `exited with code ${code} while loading its models`));
          return;
        }
        if (!expected) this.onCrash(slot, code);
      });
    });
  }

  private onReady(slot: Slot): void {
    if (this.closing !== undefined) {
      this.retire(slot);
      return;
    }
    this.becomeIdle(slot);
  }

  private onAnswer(slot: Slot, message: Extract<FromWorker, { type: 'done' | 'done-in-arena' | 'run-failed' }>): void {
    const job = slot.job;
    slot.job = undefined;
    if (job !== undefined) this.releaseFeeds(job); // the worker is done reading them
    slot.runs = message.runs;
    if (job !== undefined && job.id === message.id) {
      if (job.state === 'discarded') {
        this.counts.discarded++;
        job.state = 'settled';
      } else if (message.type === 'done') {
        this.settle(job, 'completed', fromWire(ortRuntime, message.outputs));
      } else if (message.type === 'done-in-arena') {
        // Read now, before this worker is given another job (becomeIdle below): that job would overwrite them.
        this.settle(job, 'completed', fromArena(ortRuntime, slot.arena!, message.outputs));
      } else {
        this.settle(job, 'failed', new InferenceFailedError(this.name, job.model, message.message));
      }
    }
    if (this.closing !== undefined) this.retire(slot);
    else this.becomeIdle(slot);
  }

  /** An answer that could not be deserialised: the job fails, the worker itself is fine. */
  private onAnswerLost(slot: Slot, error: unknown): void {
    const job = slot.job;
    slot.job = undefined;
    if (job !== undefined) this.releaseFeeds(job); // the worker is done reading them
    if (job !== undefined)
      this.settle(job, 'failed', new InferenceFailedError(this.name, job.model, `the worker's answer could not be read (${String(error)})`));
    if (this.closing !== undefined) this.retire(slot);
    else this.becomeIdle(slot);
  }

  private onCrash(slot: Slot, code: number): void {
    this.counts.crashed++;
    const job = slot.job;
    slot.job = undefined;
    if (job !== undefined) this.releaseFeeds(job); // the worker is done reading them
    const reason = slot.lastError instanceof Error ? slot.lastError.message : `exit code ${code}`;
    if (job !== undefined) {
      if (job.state === 'discarded') job.state = 'settled';
      else this.settle(job, 'failed', new WorkerCrashedError(this.name, slot.threadId, reason, slot.lastError));
    }
    // Steps over the caches it held can run nowhere else.
    for (const pinned of this.queue.drainPinned(slot)) this.settle(pinned, 'failed', new WorkerCrashedError(this.name, slot.threadId, reason, slot.lastError));
    if (this.closing !== undefined) return;
    this.spawn().catch((error: unknown) => {
      // The replacement could not load models its predecessor loaded: with no worker left, queued jobs would wait forever.
      if (this.slots.size > 0) return;
      for (const queued of this.queue.drain()) this.settle(queued, 'failed', error);
    });
  }

  private becomeIdle(slot: Slot): void {
    slot.state = 'idle';
    const job = this.queue.shiftFor(slot);
    if (job !== undefined) this.start(slot, job);
    else slot.worker.unref(); // an idle pool must not keep the process alive
  }

  /** Asks the worker to release its sessions and exit. */
  private retire(slot: Slot): void {
    slot.state = 'closing';
    slot.worker.ref();
    slot.worker.postMessage({ type: 'close' } satisfies ToWorker);
  }

  private idleSlot(): Slot | undefined {
    for (const slot of this.slots) if (slot.state === 'idle') return slot;
    return undefined;
  }

  private start(slot: Slot, job: Job): void {
    slot.state = 'busy';
    slot.job = job;
    job.state = 'running';
    slot.worker.ref();
    let borrow: { borrow: true; arena?: SharedArrayBuffer } | undefined;
    if (job.use !== undefined && this.config.outputArenaBytes > 0) {
      if (slot.arena !== undefined) borrow = { borrow: true };
      else borrow = { borrow: true, arena: (slot.arena = new SharedArrayBuffer(this.config.outputArenaBytes)) };
    }
    const message: ToWorker =
      job.step !== undefined
        ? { type: 'kv-step', id: job.id, model: job.model, step: job.step }
        : { type: 'run', id: job.id, model: job.model, feeds: job.feeds, pooling: job.pooling, ...borrow };
    try {
      slot.worker.postMessage(message, job.transfer);
    } catch {
      // Some buffers cannot be transferred (Node's Buffer pool is marked untransferable): copy them.
      slot.worker.postMessage(message);
    }
  }

  // ---- jobs ----

  /** Made out here so the listener captures the pool and the job alone, not `submit`'s feeds and executor (a GC cost: docs/internals/ai-figures.md). */
  private static abortListener(pool: InferencePool, job: Job): () => void {
    return () => pool.abort(job);
  }

  private abort(job: Job): void {
    if (job.state === 'queued') {
      this.queue.remove(job);
      this.counts.aborted++;
      this.releaseFeeds(job); // never sent
      job.state = 'settled';
      job.reject(this.abortError(job.signal!, 'while queued; it never ran'));
    } else if (job.state === 'running') {
      this.counts.aborted++;
      job.state = 'discarded';
      job.reject(this.abortError(job.signal!, 'while running; its result is discarded'));
    }
  }

  private releaseFeeds(job: Job): void {
    for (const buffer of job.leases) release(buffer);
    job.leases = [];
  }

  private abortError(signal: AbortSignal, when: string): AbortedError {
    const reason = errorMessage(signal.reason);
    return new AbortedError(undefined, `inference pool "${this.name}" job aborted ${when} (${reason})`);
  }

  private settle(job: Job, outcome: 'completed', value: Outputs): void;
  private settle(job: Job, outcome: 'failed', error: unknown): void;
  private settle(job: Job, outcome: 'completed' | 'failed', value: unknown): void {
    if (job.state === 'settled') return;
    // A running job settles only once its worker has answered or died: either way its feeds are no longer read.
    this.releaseFeeds(job);
    job.state = 'settled';
    if (job.onAbort !== undefined) job.signal!.removeEventListener('abort', job.onAbort);
    this.counts[outcome]++;
    if (outcome === 'failed') job.reject(value);
    else if (job.use === undefined) job.resolve(value);
    else this.lend(job, value as Outputs);
  }

  /** Calls a borrowed run's `use` on its outputs, and refuses a result that would outlive them. */
  private lend(job: Job, outputs: Outputs): void {
    let result: unknown;
    try {
      result = job.use!(outputs);
    } catch (error) {
      job.reject(error);
      return;
    }
    const refused = borrowedResultError(this.name, result, outputs);
    if (refused !== undefined) job.reject(refused);
    else job.resolve(result);
  }

  private resolveModel(model: string | undefined): string {
    const names = this.models;
    if (model === undefined) {
      if (names.length === 1) return names[0]!;
      throw new UnknownModelError(this.name, undefined, names);
    }
    if (!Object.hasOwn(this.config.models, model)) throw new UnknownModelError(this.name, model, names);
    return model;
  }
}
