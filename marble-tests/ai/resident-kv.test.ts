/**
 * `DecoderLmWorker({ resident })`: KV caches stay in the pool's worker threads. Generations joining
 * and leaving at random steps get the tokens they get alone; each sequence steps on the thread
 * holding its cache; ended generations free their caches there; the byte budget evicts and rebuilds;
 * a thread that dies takes its caches along and its sequences rebuild elsewhere.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { TestSink, eventually } from 'sluice/testing';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { DecoderLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { InferencePool, poolWorkers } from '../../src/ai/pool/pool.js';
import { WorkerCrashedError } from '../../src/ai/pool/errors.js';
import { generateRequest, type Token } from '../../src/ai/inference/worker.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { joinLeaveProperty } from '../support/join-leave.js';

let generated: GeneratedModels;
let path: string;
let single: DecoderLmWorker;

before(async () => {
  generated = await generatedModels('resident-kv');
  path = join(generated.dir, MODEL_FILES.decoder);
  single = await DecoderLmWorker.load(path);
});
after(async () => {
  await single.release();
  await generated.remove();
});

/** A decoder whose caches live in `pool`'s threads. */
const residentOn = (pool: InferencePool, options: Partial<ConstructorParameters<typeof DecoderLmWorker>[0]> = {}) =>
  DecoderLmWorker.load(path, { run: (feeds, signal) => pool.run(feeds, { signal }), resident: { pool }, ...options });

/** Waits for `check`: a step in a pool thread takes many more turns than one on this thread. */
const soon = (check: () => void) => eventually(check, { maxTicks: 100_000 });

const held = (pool: InferencePool) => pool.stats.workers.reduce((sum, w) => sum + w.resident.sequences, 0);

describe('DecoderLmWorker({ resident })', () => {
  it('property: batched steps over caches kept in two worker threads give the tokens each gets alone (greedy and sampled)', async () => {
    const pool = await InferencePool.create({ model: path, size: 2 });
    try {
      const decoder = await residentOn(pool, { batch: { maxBatch: 8 } });
      await joinLeaveProperty(single, decoder, ['abcd', 'wxyz', 'Hello', 'Hi', 'stage'], {
        maxTokens: 10,
        runs: { min: 1, max: 5 },
        numRuns: 20,
        maxTicks: 100_000,
      });
      const runs = pool.stats.workers.map((w) => w.runs);
      assert.ok(
        runs.every((r) => r > 0),
        `both threads ran steps (${runs})`,
      );
      await soon(() => assert.equal(held(pool), 0, 'every ended generation released its cache'));
    } finally {
      await pool.close();
    }
  });

  it('sixteen generations at once on two threads: each thread batches its own, far fewer calls than steps, same texts as alone', async () => {
    const pool = await InferencePool.create({ model: path, size: 2 });
    try {
      const decoder = await residentOn(pool, { batch: { maxBatch: 16 } });
      const requests = Array.from({ length: 16 }, (_, i) =>
        generateRequest({ prompt: `The stage ${i % 10}`, max_tokens: 12, temperature: i % 2 === 0 ? 0 : 0.8, seed: i }),
      );
      const expected = await Promise.all(requests.map(async (r) => (await single.infer(r)).text));
      const got = await Promise.all(requests.map(async (r) => (await decoder.infer(r)).text));
      assert.deepEqual(got, expected);
      const { calls, steps, largest } = decoder.batchStats!;
      assert.equal(steps, 16 * 12);
      assert.ok(largest === 8, `each thread's 8 stepped together (largest ${largest})`);
      assert.ok(calls <= steps / 4, `${calls} calls for ${steps} steps`);
      await soon(() => assert.equal(held(pool), 0));
    } finally {
      await pool.close();
    }
  });

  it('property: caches of different lengths in one call (left-padded, masked) too', async () => {
    const pool = await InferencePool.create({ model: path, size: 2 });
    try {
      const decoder = await residentOn(pool, { batch: { maxBatch: 8, lengthBucket: 64 } });
      await joinLeaveProperty(single, decoder, ['a', 'Hi', 'abcd', 'Hello', 'a longer prompt of words'], {
        maxTokens: 12,
        runs: { min: 2, max: 6 },
        numRuns: 20,
        maxTicks: 100_000,
      });
      await soon(() => assert.equal(held(pool), 0));
    } finally {
      await pool.close();
    }
  });

  it('a cancelled generation frees its cache in its thread; a paused one keeps it', async () => {
    const pool = await InferencePool.create({ model: path, size: 1 });
    try {
      const decoder = await residentOn(pool, { batch: { maxBatch: 4 } });
      const paused = TestSink.subscribe(decoder.generate(generateRequest({ prompt: 'The stage', max_tokens: 40, temperature: 0 })));
      const cancelled = TestSink.subscribe(decoder.generate(generateRequest({ prompt: 'Other one', max_tokens: 40, temperature: 0 })));
      paused.request(3);
      cancelled.request(3);
      await soon(() => assert.ok(paused.received.length === 3 && cancelled.received.length === 3, 'three tokens each'));
      await soon(() => assert.equal(held(pool), 2));
      cancelled.cancel();
      await soon(() => assert.equal(held(pool), 1));
      // The paused one's cache alone (prompt and two fed tokens), copied out of the call it shared:
      // 2 layers × key and value × 4 heads × 16 dims × float32 per position.
      await soon(() => assert.equal(pool.stats.workers[0]!.resident.bytes, (9 + 2) * 2 * 2 * 4 * 16 * 4));
      paused.request(100);
      await soon(() => assert.ok(paused.completed, 'the paused generation completed'));
      await soon(() => assert.deepEqual(pool.stats.workers[0]!.resident, { sequences: 0, bytes: 0 }));
    } finally {
      await pool.close();
    }
  });

  it("cacheBytes bounds the bytes held in the threads: a paused generation's cache is evicted there and rebuilt on resume", async () => {
    const pool = await InferencePool.create({ model: path, size: 1 });
    try {
      const budget = 40 * 1024;
      const bounded = await residentOn(pool, { cacheBytes: budget, batch: { maxBatch: 4 } });
      const request = generateRequest({ prompt: 'The stage pauses', max_tokens: 24, temperature: 0 });
      const expected = (await single.infer(request)).text;
      const paused = TestSink.subscribe(bounded.generate(request));
      paused.request(5);
      await soon(() => assert.equal(paused.received.length, 5));
      let most = 0;
      const other = TestSink.subscribe(bounded.generate(generateRequest({ prompt: 'Backpressure keeps memory bounded', max_tokens: 40, temperature: 0 })));
      for (let i = 0; i < 40 && !other.completed; i++) {
        other.request(1);
        await soon(() => assert.ok(other.received.length > i || other.completed, 'the next token or the end'));
        most = Math.max(most, pool.stats.workers[0]!.resident.bytes);
      }
      assert.ok(bounded.cacheStats!.evictions >= 1, `evictions ${bounded.cacheStats!.evictions}`);
      // The step that evicts runs before the release: at most one step's cache over.
      assert.ok(most <= budget + 2 * 2 * 4 * 16 * 4 * 60, `${most} bytes held at most`);
      paused.request(100);
      await soon(() => assert.ok(paused.completed, 'the paused generation completed'));
      assert.equal(paused.received.map((t: Token) => t.text).join(''), expected);
      assert.equal(bounded.cacheStats!.bytes, 0);
      await soon(() => assert.equal(held(pool), 0));
    } finally {
      await pool.close();
    }
  });

  it('steps pinned to a thread wait for it while it is busy, though another is idle, and run on the cache it holds', async () => {
    const pool = await InferencePool.create({ model: path, size: 2 });
    try {
      const [first, second] = pool.residentThreads;
      const shape = { layers: 2, heads: 4, headDim: 16 };
      // Two sequences prefilled in one call on the first thread, then stepped there one call after another.
      const prefill = pool.runResident(first!, { shape, rows: [0, 1].map((sequence) => ({ sequence, ids: [72, 105], position: 0 })) });
      const steps = [2, 3, 4].map((position) => pool.runResident(first!, { shape, rows: [0, 1].map((sequence) => ({ sequence, ids: [33], position })) }));
      await Promise.all([prefill, ...steps]);
      const runs = Object.fromEntries(pool.stats.workers.map((w) => [w.threadId, w.runs]));
      assert.deepEqual(runs, { [first!]: 4, [second!]: 0 });
      await soon(() => assert.equal(pool.stats.workers.find((w) => w.threadId === first)!.resident.sequences, 2));
      // A step over a cache the thread does not hold fails, naming the sequence, and changes nothing.
      await assert.rejects(pool.runResident(second!, { shape, rows: [{ sequence: 0, ids: [33], position: 5 }] }), /sequence 0 has 0 positions cached/);
      pool.releaseResident(first!, [0, 1]);
      await soon(() => assert.equal(pool.stats.workers.find((w) => w.threadId === first)!.resident.sequences, 0));
    } finally {
      await pool.close();
    }
  });

  it('a pool closed under running generations ends each with one error naming it, and none hangs', async () => {
    const pool = await InferencePool.create({ model: path, size: 2 });
    const decoder = await residentOn(pool, { batch: { maxBatch: 4 } });
    const sinks = ['Hello', 'stage', 'abcd', 'wxyz'].map((prompt) =>
      TestSink.subscribe(decoder.generate(generateRequest({ prompt, max_tokens: 200, temperature: 0 }))),
    );
    for (const sink of sinks) sink.request(200);
    await soon(() =>
      assert.ok(
        sinks.every((s) => s.received.length >= 2),
        'two tokens each',
      ),
    );
    await pool.close();
    await soon(() =>
      assert.ok(
        sinks.every((s) => s.error !== undefined),
        'each ended with an error',
      ),
    );
    for (const sink of sinks) {
      assert.equal(sink.completed, false);
      assert.equal((sink.error as { code?: string }).code, 'POOL_CLOSED');
    }
  });

  it('a thread that dies takes its caches: its paused sequences rebuild on a live thread and end as they would alone', async () => {
    const pool = await InferencePool.create({ model: path, size: 2 });
    try {
      const decoder = await residentOn(pool, { batch: { maxBatch: 4 } });
      const requests = ['Hello', 'stage', 'abcd', 'wxyz'].map((prompt, i) =>
        generateRequest({ prompt, max_tokens: 16, temperature: i % 2 === 0 ? 0 : 0.9, seed: i }),
      );
      const expected = await Promise.all(requests.map(async (r) => (await single.infer(r)).text));
      const sinks = requests.map((r) => TestSink.subscribe(decoder.generate(r)));
      for (const sink of sinks) sink.request(4);
      await soon(() =>
        assert.ok(
          sinks.every((s) => s.received.length === 4),
          'four tokens each',
        ),
      );
      await soon(() =>
        assert.ok(
          pool.stats.workers.every((w) => w.resident.sequences === 2 && w.state === 'idle'),
          'two caches in each idle thread',
        ),
      );
      const [victim] = pool[poolWorkers]();
      const gone = victim!.threadId;
      // Killed while idle: terminating a thread inside an onnxruntime call can abort the whole process.
      await victim!.terminate();
      await soon(() => assert.equal(pool.stats.crashed, 1));
      await assert.rejects(
        pool.runResident(gone, { shape: { layers: 2, heads: 4, headDim: 16 }, rows: [{ sequence: 0, ids: [1], position: 1 }] }),
        (error: unknown) => error instanceof WorkerCrashedError,
      );
      for (const sink of sinks) sink.request(100);
      await soon(() =>
        assert.ok(
          sinks.every((s) => s.completed || s.error !== undefined),
          'each ended',
        ),
      );
      assert.deepEqual(
        sinks.map((s) => s.error),
        sinks.map(() => undefined),
      );
      assert.deepEqual(
        sinks.map((s) => s.received.map((t: Token) => t.text).join('')),
        expected,
      );
    } finally {
      await pool.close();
    }
  });
});
