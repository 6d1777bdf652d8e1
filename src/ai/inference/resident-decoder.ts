/**
 * A decoder's generations with their KV caches resident in the pool's worker threads: each
 * sequence is placed on one thread at its first step (the one holding fewest sequences) and every
 * later step runs there, batched with the other sequences of that thread (one `StepBatcher` per
 * thread, so a call never mixes threads and every thread steps its own group at once). A step
 * sends token ids and positions and gets logits back; no cache crosses threads. A sequence whose
 * cache was dropped (evicted, or its thread died) is placed again and rebuilt by one prefill.
 */
import type { InferencePool } from '../pool/pool.js';
import type { KvShape } from '../pool/kv-stack.js';
import { kvStepKey, type DecoderBatchOptions } from './kv-batch.js';
import { StepBatcher, type StepBatcherStats } from './step-batcher.js';

/** Where a decoder's caches live: the pool whose worker threads run it, and the decoder's name there. */
export interface ResidentKvOptions {
  readonly pool: InferencePool;
  /** The decoder's model name in the pool; may be omitted when the pool holds one model. */
  readonly model?: string;
}

interface Asked {
  readonly sequence: number;
  readonly ids: readonly number[];
  readonly position: number;
}

/** What one step gives a sequence: its next token's logits, and the bytes its cache now holds in its thread. */
export interface ResidentResult {
  readonly logits: Float32Array;
  readonly bytes: number;
}

/** The resident sequences of one decoder on one pool, and a batcher per worker thread. */
export class ResidentDecoder {
  private readonly batchers = new Map<number, StepBatcher<Asked, ResidentResult>>();
  /** Sequences placed on each thread, for placing the next one. */
  private readonly placed = new Map<number, number>();
  private nextSequence = 0;
  private readonly bytesPerPosition: number;

  constructor(
    private readonly resident: ResidentKvOptions,
    private readonly shape: KvShape,
    private readonly batch: DecoderBatchOptions,
  ) {
    this.bytesPerPosition = shape.layers * 2 * shape.heads * shape.headDim * Float32Array.BYTES_PER_ELEMENT;
  }

  /** Model calls and steps, all threads together. */
  get stats(): StepBatcherStats {
    let calls = 0;
    let steps = 0;
    let largest = 0;
    let waiting = 0;
    let running = 0;
    for (const batcher of this.batchers.values()) {
      const stats = batcher.stats;
      calls += stats.calls;
      steps += stats.steps;
      largest = Math.max(largest, stats.largest);
      waiting += stats.waiting;
      running += stats.running;
    }
    // Each thread's batcher runs calls of at most maxBatch steps (default 16, as StepBatcher's).
    return { calls, steps, largest, waiting, running, maxBatch: this.batch.maxBatch ?? 16 };
  }

  /** A new sequence: nothing is held for it until its first step. */
  sequence(): ResidentSequence {
    return new ResidentSequence(this);
  }

  /** @internal A thread for a new sequence: the live one holding fewest. */
  place(): { thread: number; sequence: number } {
    const threads = this.resident.pool.residentThreads;
    for (const thread of this.placed.keys()) if (!threads.includes(thread)) this.forgetThread(thread);
    let thread = threads[0];
    for (const t of threads) if ((this.placed.get(t) ?? 0) < (this.placed.get(thread!) ?? 0)) thread = t;
    // No live thread: `runResident` rejects for thread -1, as for any thread that is gone.
    if (thread === undefined) return { thread: -1, sequence: this.nextSequence++ };
    this.placed.set(thread, (this.placed.get(thread) ?? 0) + 1);
    return { thread, sequence: this.nextSequence++ };
  }

  /** @internal Whether `thread` still holds what it was given. */
  alive(thread: number): boolean {
    return this.resident.pool.residentThreads.includes(thread);
  }

  /** @internal The step of one sequence on its thread, batched with the others there. */
  step(thread: number, asked: Asked, signal: AbortSignal): Promise<ResidentResult> {
    return this.batcherOf(thread).step(asked, signal);
  }

  /** @internal Frees `sequence`'s cache in `thread`. */
  release(thread: number, sequence: number): void {
    const left = (this.placed.get(thread) ?? 1) - 1;
    if (left > 0) this.placed.set(thread, left);
    else this.placed.delete(thread);
    this.resident.pool.releaseResident(thread, [sequence]);
  }

  private forgetThread(thread: number): void {
    this.placed.delete(thread);
    this.batchers.delete(thread);
  }

  private batcherOf(thread: number): StepBatcher<Asked, ResidentResult> {
    const existing = this.batchers.get(thread);
    if (existing !== undefined) return existing;
    const { lengthBucket: bucket = 1, tokenBudget = 2048, concurrency: _, ...rest } = this.batch;
    const { pool, model } = this.resident;
    const shape: KvShape = { layers: this.shape.layers, heads: this.shape.heads, headDim: this.shape.headDim };
    const batcher = new StepBatcher<Asked, ResidentResult>(
      async (steps) => {
        const { logits } = await pool.runResident(thread, { shape, rows: steps }, model === undefined ? {} : { model });
        const vocab = logits!.dims[1]!;
        const data = logits!.data as Float32Array;
        // A row's cache is as long as the longest in its call (shorter ones are left-padded).
        const bytes = (Math.max(...steps.map((s) => s.position)) + steps[0]!.ids.length) * this.bytesPerPosition;
        return steps.map((_, i) => ({ logits: data.subarray(i * vocab, (i + 1) * vocab), bytes }));
      },
      kvStepKey(bucket),
      // One call at a time per thread: the thread runs one anyway, and its next call's group forms meanwhile.
      { ...rest, concurrency: 1, weight: (step) => step.ids.length, maxWeight: tokenBudget },
    );
    this.batchers.set(thread, batcher);
    return batcher;
  }
}

/** One generation's handle on its resident cache: the thread holding it, its id there, and its length. */
export class ResidentSequence {
  private thread = -1;
  private id: number | undefined;
  private length = 0;
  private inflight: Promise<unknown> | undefined;

  constructor(private readonly owner: ResidentDecoder) {}

  /**
   * The next token's logits after `tokens` (the whole text so far): feeds what the cache lacks, the
   * last token, or every token when there is no cache (first step, evicted, its thread gone).
   */
  async step(tokens: readonly number[], signal: AbortSignal): Promise<ResidentResult> {
    if (this.id !== undefined && !this.owner.alive(this.thread)) this.forget();
    if (this.id === undefined) {
      const placed = this.owner.place();
      this.thread = placed.thread;
      this.id = placed.sequence;
      this.length = 0;
    }
    const id = this.id;
    const total = tokens.length;
    const pending = this.owner.step(this.thread, { sequence: id, ids: tokens.slice(this.length), position: this.length }, signal);
    this.inflight = pending;
    try {
      const result = await pending;
      // Dropped while it ran: the cache is being released, and the next step rebuilds it.
      if (this.id !== id) return { logits: result.logits, bytes: 0 };
      this.length = total;
      return result;
    } finally {
      if (this.inflight === pending) this.inflight = undefined;
    }
  }

  /** Frees the cache (the generation ended, or the budget evicted it); a later step rebuilds it. */
  drop(): void {
    if (this.id === undefined) return;
    const { thread, id } = this;
    this.id = undefined;
    this.length = 0;
    // After a step in flight: the worker handles messages in order, but the step may still wait in the pool's queue.
    const release = () => this.owner.release(thread, id);
    if (this.inflight === undefined) release();
    else this.inflight.then(release, release);
  }

  /** Its thread died: the cache went with it, there is nothing to release. */
  private forget(): void {
    this.id = undefined;
    this.length = 0;
  }
}
