import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { firstValueFrom, toArray } from 'rxjs';
import type { Batch } from '../../operators/batch.js';
import { infer } from '../../src/ai/stages/infer.js';
import { fromIterable } from '../../src/flow/sources.js';
import { AbortedError, InvalidOptionsError, type SluiceError } from '../../src/core/errors.js';
import { buildEmbeddingModel } from '../../src/ai/models/embedding.js';
import { ModelCorruptError, ModelNotFoundError } from '../../src/ai/models/errors.js';
import { EMBEDDING_CONFIG } from '../../src/ai/models/generate.js';
import { BorrowedOutputsError, InferenceFailedError, PoolClosedError, PoolQueueFullError, UnknownModelError } from '../../src/ai/pool/errors.js';
import { embedder, tensorRows, textFeeds } from '../../src/ai/pool/embedder.js';
import { leased } from '../../src/ai/models/leases.js';
import { until } from '../support/ws-client.js';
import type { Feeds, InferencePoolOptions } from '../../src/ai/pool/options.js';
import { InferencePool, poolWorkers } from '../../src/ai/pool/pool.js';
import { FeedBuffers, HashTokenizer } from '../../src/ai/models/tokenizer.js';

let dir: string;
let modelPath: string;
let reference: ort.InferenceSession;

before(async () => {
  // A fresh directory: the tests must pass on a clean checkout, with no models/ yet.
  dir = await mkdtemp(join(tmpdir(), 'sluice-pool-'));
  modelPath = join(dir, 'embed.onnx');
  await writeFile(modelPath, buildEmbeddingModel(EMBEDDING_CONFIG));
  reference = await ort.InferenceSession.create(modelPath, { executionProviders: ['cpu'] });
});

after(async () => {
  await reference.release();
  await rm(dir, { recursive: true, force: true });
});

/** Deterministic token ids: `rows` × `seq`, varied by `salt`, every row unpadded. */
function feeds(rows: number, seq: number, salt = 0): Feeds {
  const ids = BigInt64Array.from({ length: rows * seq }, (_, i) => BigInt(1 + ((i * 7919 + salt * 104_729) % 4000)));
  return {
    input_ids: new ort.Tensor('int64', ids, [rows, seq]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(rows * seq).fill(1n), [rows, seq]),
  };
}

async function onMainThread(input: Feeds): Promise<Float32Array> {
  const { embeddings } = await reference.run(input);
  return embeddings!.data as Float32Array;
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => assert.fail('expected a rejection'),
    (error: unknown) => error,
  );
}

async function expectCode<E extends SluiceError>(promise: Promise<unknown>, type: abstract new (...args: never[]) => E, code: string): Promise<E> {
  const error = await rejection(promise);
  assert.ok(error instanceof type, `expected ${type.name}, got ${String(error)}`);
  assert.equal(error.code, code);
  return error;
}

/** Runs `body` on a fresh pool, closed afterwards whatever happens. */
async function withPool(options: InferencePoolOptions, body: (pool: InferencePool) => Promise<void>): Promise<void> {
  const pool = await InferencePool.create(options);
  try {
    await body(pool);
  } finally {
    await pool.close();
  }
}

const totalRuns = (pool: InferencePool) => pool.stats.workers.reduce((sum, w) => sum + w.runs, 0);

describe('InferencePool (real onnxruntime in worker threads)', () => {
  it('returns what session.run on the main thread returns for the same feeds, transferring the feed buffers with transferFeeds: true', async () => {
    await withPool({ model: modelPath, size: 1, transferFeeds: true }, async (pool) => {
      for (const [rows, seq, salt] of [
        [1, 5, 1],
        [3, 17, 2],
        [8, 64, 3],
      ] as const) {
        const expected = await onMainThread(feeds(rows, seq, salt));
        const input = feeds(rows, seq, salt);
        const outputs = await pool.run(input);
        const embeddings = outputs.embeddings;
        assert.ok(embeddings instanceof ort.Tensor, 'outputs are rebuilt as ort.Tensor');
        assert.deepEqual(embeddings.dims, [rows, EMBEDDING_CONFIG.dim]);
        assert.deepEqual(embeddings.data, expected);
        assert.equal((input.input_ids!.data as BigInt64Array).byteLength, 0, 'the feed buffer was transferred, not copied');
      }
      assert.deepEqual(pool.describe(), { inputNames: ['input_ids', 'attention_mask'], outputNames: ['embeddings'] });
    });
  });

  it('copies instead of transferring with transferFeeds: false, and sends only the viewed part of a much larger buffer', async () => {
    await withPool({ model: modelPath, size: 1, transferFeeds: false }, async (pool) => {
      const input = feeds(2, 9, 4);
      const expected = await onMainThread(input);
      const big = new BigInt64Array(1000).fill(7n);
      const viewed = {
        ...input,
        input_ids: new ort.Tensor('int64', (() => (big.set(input.input_ids!.data as BigInt64Array, 100), big.subarray(100, 118)))(), [2, 9]),
      };
      const outputs = await pool.run(viewed);
      assert.deepEqual(outputs.embeddings!.data, expected);
      assert.equal(big.byteLength, 8000, 'the caller keeps its buffer');
      assert.equal((input.attention_mask!.data as BigInt64Array).byteLength, 2 * 9 * 8);
    });
  });

  it('with transferFeeds: false has copied the feeds when run returns: arrays refilled at once, even for queued jobs, give every job its own result', async () => {
    await withPool({ model: modelPath, size: 1, transferFeeds: false }, async (pool) => {
      const salts = [1, 2, 3, 4];
      const expected = await Promise.all(salts.map((salt) => onMainThread(feeds(2, 7, salt))));
      const input = feeds(2, 7, 0);
      // The first run takes the only worker, the rest queue; each is written into the same arrays the previous one used.
      const runs = salts.map((salt) => {
        (input.input_ids!.data as BigInt64Array).set(feeds(2, 7, salt).input_ids!.data as BigInt64Array);
        return pool.run(input);
      });
      assert.equal(pool.stats.queued, salts.length - 1);
      const outputs = await Promise.all(runs);
      outputs.forEach((output, i) => assert.deepEqual(output.embeddings!.data, expected[i], `run ${i}`));
    });
  });

  it('reads FeedBuffers in place, leasing them until the worker is done: queued batches get their own buffers, finished ones are reused', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      const tokenizer = new HashTokenizer();
      const batches = [
        ['the first batch', 'of two texts'],
        ['a second batch, queued behind the first'],
        ['a third', 'queued too', 'three texts'],
        ['and a fourth'],
      ];
      const expected = await Promise.all(batches.map((texts) => onMainThread(textFeeds(tokenizer, texts))));
      const buffers = new FeedBuffers();
      const shared = new Set<SharedArrayBuffer>();
      const runs = batches.map((texts) => {
        const input = textFeeds(tokenizer, texts, undefined, buffers);
        const buffer = (input.input_ids!.data as BigInt64Array).buffer;
        assert.ok(buffer instanceof SharedArrayBuffer, 'FeedBuffers are shared memory');
        assert.ok(!shared.has(buffer), 'a buffer a pending run still reads is never handed out again');
        shared.add(buffer);
        return pool.run(input);
      });
      assert.ok([...shared].every((buffer) => leased(buffer)));
      const outputs = await Promise.all(runs);
      outputs.forEach((output, i) => assert.deepEqual(output.embeddings!.data, expected[i], `batch ${i}`));
      assert.ok(
        [...shared].every((buffer) => !leased(buffer)),
        'every lease ends with its run',
      );
      const again = (textFeeds(tokenizer, ['once the runs are over'], undefined, buffers).input_ids!.data as BigInt64Array).buffer as SharedArrayBuffer;
      assert.ok(shared.has(again), 'a finished buffer is reused');
      const [outputsAgain, reference] = await Promise.all([
        pool.run(textFeeds(tokenizer, ['once the runs are over'], undefined, buffers)),
        onMainThread(textFeeds(tokenizer, ['once the runs are over'])),
      ]);
      assert.deepEqual(outputsAgain.embeddings!.data, reference);
    });
  });

  it('ends the lease of an aborted job when the worker can no longer read it: queued at once, running when it answers', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      const tokenizer = new HashTokenizer();
      const running = new AbortController();
      const queued = new AbortController();
      const first = textFeeds(tokenizer, ['a long running batch '.repeat(20)], undefined, new FeedBuffers());
      const second = textFeeds(tokenizer, ['a queued batch'], undefined, new FeedBuffers());
      const [firstBuffer, secondBuffer] = [
        (first.input_ids!.data as BigInt64Array).buffer as SharedArrayBuffer,
        (second.input_ids!.data as BigInt64Array).buffer as SharedArrayBuffer,
      ];
      const runs = [pool.run(first, { signal: running.signal }), pool.run(second, { signal: queued.signal })].map((run) =>
        run.catch((error: unknown) => error),
      );
      queued.abort(new Error('not needed'));
      assert.equal(leased(secondBuffer), false, 'a queued job that aborts never reaches the worker');
      running.abort(new Error('not needed either'));
      assert.equal(leased(firstBuffer), true, 'the worker may still be reading a running job that aborted');
      const [a, b] = await Promise.all(runs);
      assert.ok(a instanceof AbortedError && b instanceof AbortedError);
      await until(() => pool.stats.running === 0, 'the worker answers the discarded run');
      assert.equal(leased(firstBuffer), false, 'released when the worker answered');
    });
  });

  it('completes many concurrent jobs across workers, each with its own result', async () => {
    await withPool({ model: modelPath, size: 2 }, async (pool) => {
      const jobs = Array.from({ length: 40 }, (_, i) => ({ salt: i, seq: 1 + (i % 13) }));
      const expected = await Promise.all(jobs.map(({ salt, seq }) => onMainThread(feeds(2, seq, salt))));
      const actual = await Promise.all(jobs.map(({ salt, seq }) => pool.run(feeds(2, seq, salt))));
      actual.forEach((outputs, i) => assert.deepEqual(outputs.embeddings!.data, expected[i], `job ${i}`));
      const stats = pool.stats;
      assert.equal(stats.completed, 40);
      assert.equal(stats.queued, 0);
      assert.equal(stats.running, 0);
      assert.equal(totalRuns(pool), 40, 'the workers report 40 runs between them');
      // The first two jobs went to the two idle workers synchronously, so both worked.
      assert.ok(
        stats.workers.every((w) => w.runs > 0),
        JSON.stringify(stats.workers),
      );
    });
  });

  it('removes a queued job whose signal aborts: it rejects with AbortedError and never runs', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      // The only worker takes the first job synchronously; the next two must queue behind it.
      const first = pool.run(feeds(4, 32, 1));
      const controller = new AbortController();
      const aborted = pool.run(feeds(1, 8, 2), { signal: controller.signal });
      const third = pool.run(feeds(1, 8, 3));
      assert.equal(pool.stats.queued, 2);
      controller.abort(new Error('client went away'));
      assert.equal(pool.stats.queued, 1, 'removed from the queue at once');
      const error = await expectCode(aborted, AbortedError, 'ABORTED');
      assert.match(error.message, /queued; it never ran.*client went away/);
      await first;
      assert.deepEqual((await third).embeddings!.data, await onMainThread(feeds(1, 8, 3)));
      assert.equal(totalRuns(pool), 2, 'the worker ran the first and third jobs only');
      assert.equal(pool.stats.aborted, 1);
      await expectCode(pool.run(feeds(1, 1), { signal: AbortSignal.abort() }), AbortedError, 'ABORTED');
      assert.equal(totalRuns(pool), 2, 'an already aborted signal is not even queued');
    });
  });

  it('rejects a running job at once when its signal aborts, and drops its result when the worker answers', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      const controller = new AbortController();
      const running = pool.run(feeds(4, 32, 1), { signal: controller.signal });
      assert.equal(pool.stats.running, 1);
      controller.abort();
      await expectCode(running, AbortedError, 'ABORTED');
      // The worker is still busy with it: the next job waits for that answer.
      const next = pool.run(feeds(1, 3, 5));
      assert.equal(pool.stats.queued, 1);
      await next;
      assert.equal(pool.stats.discarded, 1);
      assert.equal(totalRuns(pool), 2, 'the aborted job did run to completion in the worker');
    });
  });

  it('turns a job away with PoolQueueFullError when every worker is busy and maxQueue jobs wait', async () => {
    await withPool({ model: modelPath, size: 1, maxQueue: 1 }, async (pool) => {
      const running = pool.run(feeds(1, 4, 1));
      const queued = pool.run(feeds(1, 4, 2));
      const error = await expectCode(pool.run(feeds(1, 4, 3)), PoolQueueFullError, 'POOL_QUEUE_FULL');
      assert.equal(error.maxQueue, 1);
      await Promise.all([running, queued]);
      assert.equal(pool.stats.rejected, 1);
      await pool.run(feeds(1, 4, 4)); // room again
    });
  });

  it('close() rejects queued jobs, lets the running one finish, and leaves no worker thread alive', async () => {
    const pool = await InferencePool.create({ model: modelPath, size: 1 });
    const threadIds = pool.stats.workers.map((w) => w.threadId);
    const exits = pool[poolWorkers]().map((worker) => new Promise<number>((resolve) => worker.once('exit', resolve)));
    const running = pool.run(feeds(2, 16, 1));
    const queued = [pool.run(feeds(1, 4, 2)), pool.run(feeds(1, 4, 3))];
    const closed = pool.close();
    for (const job of queued) assert.match((await expectCode(job, PoolClosedError, 'POOL_CLOSED')).message, /before this queued job started/);
    assert.deepEqual((await running).embeddings!.data, await onMainThread(feeds(2, 16, 1)));
    await closed;
    assert.equal(exits.length, threadIds.length);
    await Promise.all(exits); // every thread emitted 'exit'
    const stats = pool.stats;
    assert.deepEqual(stats.workers, []);
    assert.equal(stats.exited, 1);
    assert.equal(stats.crashed, 0, 'a worker asked to close is not a crash');
    assert.equal(stats.closed, true);
    await expectCode(pool.run(feeds(1, 1)), PoolClosedError, 'POOL_CLOSED');
    await pool.close(); // idempotent
  });

  it('replaces a worker that dies, and runs later jobs on the replacement', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      const [worker] = pool[poolWorkers]();
      const before = worker!.threadId;
      // Killed while idle: terminating a thread inside an onnxruntime call can abort the whole process.
      await worker!.terminate();
      await eventually(() => pool.stats.crashed === 1 && pool.stats.workers.length === 1 && pool.stats.workers[0]!.threadId !== before);
      assert.deepEqual((await pool.run(feeds(1, 6, 2))).embeddings!.data, await onMainThread(feeds(1, 6, 2)));
    });
  });

  it('rejects feeds onnxruntime refuses with InferenceFailedError, and an unknown model with UnknownModelError', async () => {
    await withPool({ models: { embed: modelPath, again: modelPath }, size: 1 }, async (pool) => {
      const bad = { input_ids: new ort.Tensor('float32', new Float32Array(4), [1, 4]) };
      const error = await expectCode(pool.run(bad, { model: 'embed' }), InferenceFailedError, 'INFERENCE_FAILED');
      assert.match(error.message, /model "embed"/);
      await expectCode(pool.run(feeds(1, 2), { model: 'nope' }), UnknownModelError, 'UNKNOWN_MODEL');
      await expectCode(pool.run(feeds(1, 2)), UnknownModelError, 'UNKNOWN_MODEL');
      assert.deepEqual((await pool.run(feeds(1, 2), { model: 'again' })).embeddings!.data, await onMainThread(feeds(1, 2)));
      assert.deepEqual(pool.models, ['embed', 'again']);
    });
  });

  it("with niceness, its worker threads run that much below this process's priority, and this thread keeps its own (Linux)", {
    skip: process.platform !== 'linux',
  }, async () => {
    const niceOf = async (): Promise<number[]> => {
      const tasks = await readdir('/proc/self/task');
      // Field 19 of a thread's stat is its nice value; the name before it may hold spaces, so count from the ')'.
      return Promise.all(tasks.map(async (tid) => Number((await readFile(`/proc/self/task/${tid}/stat`, 'utf8')).split(') ')[1]!.split(' ')[16])));
    };
    const own = async () => Number((await readFile('/proc/thread-self/stat', 'utf8')).split(') ')[1]!.split(' ')[16]);
    const before = await niceOf();
    const ownBefore = await own();
    await withPool({ model: modelPath, size: 2, niceness: 7 }, async (pool) => {
      await pool.run(feeds(1, 4));
      const during = await niceOf();
      const lowered = Math.min(19, ownBefore + 7);
      assert.equal(during.filter((n) => n === lowered).length - before.filter((n) => n === lowered).length, 2, `nice values ${during.join(' ')}`);
      assert.equal(await own(), ownBefore);
    });
    const invalid = await rejection(InferencePool.create({ model: modelPath, niceness: 20 }));
    assert.ok(invalid instanceof InvalidOptionsError && invalid.issues[0]?.path === 'niceness', String(invalid));
  });

  it('fails at creation with a typed error for a missing model, bytes that are not ONNX, or bad options', async () => {
    const missing = join(dir, 'missing.onnx');
    const notFound = await rejection(InferencePool.create({ model: missing, size: 1 }));
    assert.ok(notFound instanceof ModelNotFoundError, String(notFound));
    assert.equal(notFound.path, missing);
    const garbage = join(dir, 'garbage.onnx');
    await writeFile(garbage, 'not a model');
    const corrupt = await rejection(InferencePool.create({ model: garbage, size: 2 }));
    assert.ok(corrupt instanceof ModelCorruptError, String(corrupt));
    assert.equal(corrupt.code, 'MODEL_CORRUPT');
    const invalid = await rejection(InferencePool.create({ model: modelPath, models: { a: modelPath }, size: 0 } as never));
    assert.ok(invalid instanceof InvalidOptionsError, String(invalid));
    assert.deepEqual(invalid.issues.map((i) => i.path).sort(), ['model', 'size']);
  });
});

describe('InferencePool.runBorrowed (outputs in a shared arena the worker reuses)', () => {
  it('hands use() the same outputs as run(), in one shared buffer per worker that every borrowed run reuses', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      const arenas = new Set<ArrayBufferLike>();
      for (const [rows, seq, salt] of [
        [1, 5, 1],
        [3, 17, 2],
        [8, 64, 3],
        [2, 9, 4],
      ] as const) {
        const expected = await onMainThread(feeds(rows, seq, salt));
        const copied = await pool.runBorrowed(feeds(rows, seq, salt), ({ embeddings }) => {
          const data = embeddings!.data as Float32Array;
          arenas.add(data.buffer);
          assert.deepEqual(embeddings!.dims, [rows, EMBEDDING_CONFIG.dim]);
          return data.slice();
        });
        assert.deepEqual(copied, expected, `${rows}×${seq}`);
      }
      assert.equal(arenas.size, 1, 'every run wrote into the same memory');
      assert.ok([...arenas][0] instanceof SharedArrayBuffer);
      // Plain runs still hand over buffers of their own.
      const owned = (await pool.run(feeds(1, 3, 5))).embeddings!.data as Float32Array;
      assert.ok(owned.buffer instanceof ArrayBuffer && !arenas.has(owned.buffer));
      assert.equal(pool.stats.completed, 5);
    });
  });

  it('lends each worker its own arena, and reads every answer before that worker runs again', async () => {
    await withPool({ model: modelPath, size: 2 }, async (pool) => {
      const jobs = Array.from({ length: 24 }, (_, i) => ({ salt: i, seq: 1 + (i % 11) }));
      const expected = await Promise.all(jobs.map(({ salt, seq }) => onMainThread(feeds(2, seq, salt))));
      const arenas = new Set<ArrayBufferLike>();
      const actual = await Promise.all(
        jobs.map(({ salt, seq }) =>
          pool.runBorrowed(feeds(2, seq, salt), ({ embeddings }) => {
            arenas.add((embeddings!.data as Float32Array).buffer);
            return Array.from(embeddings!.data as Float32Array);
          }),
        ),
      );
      actual.forEach((values, i) => assert.deepEqual(Float32Array.from(values), expected[i], `job ${i}`));
      assert.equal(arenas.size, 2, 'one arena per worker');
    });
  });

  it('falls back to fresh buffers for outputs larger than the arena, and never uses one with outputArenaBytes: 0', async () => {
    for (const outputArenaBytes of [64, 0]) {
      await withPool({ model: modelPath, size: 1, outputArenaBytes }, async (pool) => {
        const expected = await onMainThread(feeds(4, 6, 7));
        const [values, shared] = await pool.runBorrowed(feeds(4, 6, 7), ({ embeddings }) => {
          const data = embeddings!.data as Float32Array;
          return [data.slice(), data.buffer instanceof SharedArrayBuffer] as const;
        });
        assert.deepEqual(values, expected);
        assert.equal(shared, false, `outputArenaBytes ${outputArenaBytes}: 4 × 384 floats do not fit`);
      });
    }
    const invalid = await rejection(InferencePool.create({ model: modelPath, size: 1, outputArenaBytes: -1 }));
    assert.ok(invalid instanceof InvalidOptionsError, String(invalid));
    assert.deepEqual(
      invalid.issues.map((i) => i.path),
      ['outputArenaBytes'],
    );
  });

  it('refuses a use() that would outlive the outputs (a Promise, a view into them) and passes on what use() throws; the pool goes on', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      const asPromise = await expectCode(
        pool.runBorrowed(feeds(1, 4, 1), async ({ embeddings }) => embeddings!.data),
        BorrowedOutputsError,
        'BORROWED_OUTPUTS',
      );
      assert.match(asPromise.message, /Promise/);
      const view = await expectCode(
        pool.runBorrowed(feeds(2, 4, 1), ({ embeddings }) => tensorRows(embeddings!)),
        BorrowedOutputsError,
        'BORROWED_OUTPUTS',
      );
      assert.match(view.message, /copy what you keep/);
      await expectCode(
        pool.runBorrowed(feeds(1, 4, 1), ({ embeddings }) => embeddings!.data),
        BorrowedOutputsError,
        'BORROWED_OUTPUTS',
      );
      const thrown = new Error('the reader failed');
      assert.equal(
        await rejection(
          pool.runBorrowed(feeds(1, 4, 1), () => {
            throw thrown;
          }),
        ),
        thrown,
      );
      assert.deepEqual(
        await pool.runBorrowed(feeds(1, 4, 2), ({ embeddings }) => (embeddings!.data as Float32Array).slice()),
        await onMainThread(feeds(1, 4, 2)),
      );
      assert.ok((await rejection(pool.runBorrowed(feeds(1, 4, 1), undefined as never))) instanceof TypeError);
      assert.equal(totalRuns(pool), 5, 'a run without a reader never started');
    });
  });

  it('aborts like run(): a queued borrowed job never runs, a running one is discarded and its use() never called', async () => {
    await withPool({ model: modelPath, size: 1 }, async (pool) => {
      let called = 0;
      const read = ({ embeddings }: Record<string, ort.Tensor>) => (called++, (embeddings!.data as Float32Array).slice());
      const running = new AbortController();
      const queued = new AbortController();
      const first = pool.runBorrowed(feeds(4, 32, 1), read, { signal: running.signal });
      const second = pool.runBorrowed(feeds(1, 8, 2), read, { signal: queued.signal });
      const third = pool.runBorrowed(feeds(1, 8, 3), read);
      queued.abort();
      running.abort();
      await expectCode(first, AbortedError, 'ABORTED');
      await expectCode(second, AbortedError, 'ABORTED');
      assert.deepEqual(await third, await onMainThread(feeds(1, 8, 3)));
      assert.equal(called, 1, 'only the third run was read');
      assert.equal(totalRuns(pool), 2);
      assert.equal(pool.stats.discarded, 1);
    });
  });
});

describe('infer (micro-batching on the pool)', () => {
  const tokenizer = new HashTokenizer();
  const words = ['model', 'stream', 'backpressure', 'token', 'queue', 'worker', 'tensor', 'batch', 'trace', 'signal'];
  const text = (i: number, length: number) => Array.from({ length }, (_, j) => words[(i * 7 + j * 3) % words.length]).join(' ');

  async function embedOnMainThread(value: string): Promise<Float32Array> {
    return onMainThread(textFeeds(tokenizer, [value]));
  }

  function assertClose(actual: Float32Array, expected: Float32Array, what: string): void {
    assert.equal(actual.length, expected.length, what);
    for (let i = 0; i < actual.length; i++) assert.ok(Math.abs(actual[i]! - expected[i]!) < 1e-5, `${what}: [${i}] ${actual[i]} vs ${expected[i]}`);
  }

  let pool: InferencePool;
  before(async () => {
    pool = await InferencePool.create({ model: modelPath, size: 2 });
  });
  after(async () => {
    await pool.close();
  });

  it('runs elements in batches of more than one, and gives each result back to its own element and trace', async () => {
    const texts = Array.from({ length: 40 }, (_, i) => text(i, 1 + (i % 5)));
    const sizes: number[] = [];
    const results = await firstValueFrom(
      fromIterable(texts).pipe(
        infer({
          pool,
          toFeeds: (batch: Batch<string>) => (sizes.push(batch.size), textFeeds(tokenizer, batch.items)),
          fromOutputs: (outputs, batch) => tensorRows(outputs.embeddings!).map((vector, i) => ({ text: batch.items[i]!, vector })),
          maxBatch: 8,
          maxWait: 50,
        }),
        toArray(),
      ),
    );
    assert.equal(results.length, texts.length);
    assert.ok(Math.max(...sizes) > 1, `batch sizes ${sizes}`);
    assert.equal(
      sizes.reduce((a, b) => a + b, 0),
      texts.length,
    );
    assert.equal(pool.stats.completed >= sizes.length, true);
    const traceIds = new Set<string>();
    for (const [i, { value, trace }] of results.entries()) {
      assert.equal(value.text, texts[i], 'results come out in input order');
      assert.equal(trace.seq, i, 'each element keeps its own trace');
      traceIds.add(trace.traceId);
      assert.ok(Number(trace.notes?.['infer.batchSize']) >= 1, JSON.stringify(trace.notes));
      assertClose(value.vector, await embedOnMainThread(texts[i]!), `text ${i}`);
    }
    assert.equal(traceIds.size, texts.length);
    const noted = results.map(({ trace }) => Number(trace.notes!['infer.batchSize']));
    assert.deepEqual([...new Set(noted)].sort(), [...new Set(sizes)].sort(), 'the trace notes the size of the batch the element ran in');
  });

  it('groups by sequence-length bucket, so short texts are never padded to a long one', async () => {
    const length = (value: string) => tokenizer.encode(value).length;
    const texts = Array.from({ length: 32 }, (_, i) => text(i, i % 2 === 0 ? 2 : 40));
    const batches: { lengths: number[]; padded: number }[] = [];
    const results = await firstValueFrom(
      fromIterable(texts).pipe(
        infer({
          pool,
          toFeeds: (batch: Batch<string>) => {
            const feeds = textFeeds(tokenizer, batch.items);
            batches.push({ lengths: batch.items.map(length), padded: feeds.input_ids!.dims[1]! });
            return feeds;
          },
          fromOutputs: (outputs) => tensorRows(outputs.embeddings!),
          maxBatch: 8,
          maxWait: 50,
          groupBySequenceLength: { length },
        }),
        toArray(),
      ),
    );
    assert.ok(
      batches.some((b) => b.lengths.length > 1),
      'batches of more than one',
    );
    for (const { lengths, padded } of batches) {
      const buckets = new Set(lengths.map((n) => Math.ceil(n / 16)));
      assert.equal(buckets.size, 1, `one bucket per batch: lengths ${lengths}`);
      assert.ok(padded <= Math.ceil(lengths[0]! / 16) * 16, `padded to ${padded} for lengths ${lengths}`);
    }
    // Batches of different buckets complete out of input order: the trace says which input each result is.
    assert.deepEqual(
      results.map(({ trace }) => trace.seq).sort((a, b) => a - b),
      texts.map((_, i) => i),
    );
    for (const { value, trace } of results) {
      const input = texts[trace.seq]!;
      assert.equal(trace.notes?.['infer.lengthBucket'], Math.ceil(length(input) / 16));
      assertClose(value, await embedOnMainThread(input), `text ${trace.seq}`);
    }
  });

  it('with borrowOutputs, fromOutputs reads the outputs in the arena: the same results, and a returned view fails the element', async () => {
    const texts = Array.from({ length: 30 }, (_, i) => text(i, 1 + (i % 6)));
    const run = (borrowOutputs: boolean, fromOutputs: (outputs: Record<string, ort.Tensor>, batch: Batch<string>) => readonly Float32Array[]) =>
      firstValueFrom(
        fromIterable(texts).pipe(
          infer({ pool, toFeeds: (batch: Batch<string>) => textFeeds(tokenizer, batch.items), fromOutputs, maxBatch: 8, maxWait: 20, borrowOutputs }),
          toArray(),
        ),
      );
    const shared: boolean[] = [];
    const copies = await run(true, (outputs) =>
      tensorRows(outputs.embeddings!).map((row) => (shared.push(row.buffer instanceof SharedArrayBuffer), row.slice())),
    );
    assert.deepEqual(
      shared,
      texts.map(() => true),
      'every batch was read in shared memory',
    );
    const owned = await run(false, (outputs) => tensorRows(outputs.embeddings!));
    assert.deepEqual(
      copies.map(({ value }) => value),
      owned.map(({ value }) => value),
    );
    for (const [i, { value }] of copies.entries()) assertClose(value, await embedOnMainThread(texts[i]!), `text ${i}`);
    const escaped = await rejection(run(true, (outputs) => tensorRows(outputs.embeddings!)));
    assert.ok(escaped instanceof BorrowedOutputsError, String(escaped));
    assert.match(escaped.message, /fromOutputs/);
  });

  it('embedder(pool, tokenizer) returns one vector per text, equal to a main-thread run', async () => {
    const embed = embedder(pool, tokenizer);
    const texts = [text(1, 3), text(2, 12), ''];
    const vectors = await embed(texts, new AbortController().signal);
    assert.equal(vectors.length, 3);
    for (const [i, vector] of vectors.entries()) assertClose(vector, await embedOnMainThread(texts[i]!), `text ${i}`);
    assert.deepEqual(await embed([]), []);
  });

  it('rejects bad options naming each field, and a model the pool does not hold', () => {
    const bad = () => infer({ pool, toFeeds: () => ({}), fromOutputs: () => [], maxBatch: 0, maxWait: -1 });
    assert.throws(
      bad,
      (error: unknown) =>
        error instanceof InvalidOptionsError &&
        error.issues
          .map((i) => i.path)
          .sort()
          .join() === 'maxBatch,maxWait',
    );
    assert.throws(() => infer({ pool, toFeeds: () => ({}), fromOutputs: () => [], maxBatch: 1, maxWait: 1, model: 'other' }), UnknownModelError);
  });
});

/** Waits, a bounded number of event-loop turns, for a condition an event will make true. */
async function eventually(condition: () => boolean, turns = 2000): Promise<void> {
  for (let i = 0; i < turns; i++) {
    if (condition()) return;
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  assert.fail('the condition never became true');
}
