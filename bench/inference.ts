/**
 * Inference off the main thread, and dynamic micro-batching, on the generated
 * embedding model (real onnxruntime, no mocks).
 *
 *   node --conditions=sluice-source --expose-gc --import tsx bench/inference.ts
 *
 * 1. Event-loop delay p99 (`monitorEventLoopDelay`) while inference runs flat out:
 *    `session.run` inline on the main thread vs the same runs on an `InferencePool`.
 * 2. Throughput at saturation through `infer`: batched (maxBatch 32) vs one element per run.
 * 3. p99 element latency under an open-loop load at half and a quarter of one worker's
 *    batched capacity, against the bound maxWait + 2 × batch service time (outputs
 *    borrowed in the worker's arena; the half load once more with fresh output buffers).
 * 4. Batched throughput on 2 workers vs 1.
 *
 * Every phase checks its outputs (count, finite vectors), so nothing is optimised away.
 */
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { availableParallelism, tmpdir } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import * as ort from 'onnxruntime-node';
import { firstValueFrom, lastValueFrom, reduce } from 'rxjs';
import type { Batch } from '../operators/batch.js';
import { infer } from '../src/ai/stages/infer.js';
import { fromAsyncIterable, fromIterable } from '../src/flow/sources.js';
import { buildEmbeddingModel } from '../src/ai/models/embedding.js';
import { EMBEDDING_CONFIG } from '../src/ai/models/generate.js';
import { tensorRows, textFeeds } from '../src/ai/pool/embedder.js';
import type { Feeds } from '../src/ai/pool/options.js';
import { InferencePool } from '../src/ai/pool/pool.js';
import { FeedBuffers, HashTokenizer } from '../src/ai/models/tokenizer.js';

const COMMAND = 'node --conditions=sluice-source --expose-gc --import tsx bench/inference.ts';
const LOAD_MS = 3_000;
/** Heavy runs for the event-loop phase: 64 texts × 256 tokens, a few ms each. */
const HEAVY_ROWS = 64;
const HEAVY_SEQ = 256;
const MAX_BATCH = 32;
const MAX_WAIT = 5;
const ITEMS = 6_000;
/** Length of each open-loop latency phase: long enough that its p99 rests on dozens of batches. */
const LATENCY_SECONDS = 4;

const tokenizer = new HashTokenizer();
/** Reused by every run's feeds, as `embedder` does: shared memory the workers read in place, leased until they are done. */
const buffers = new FeedBuffers();
const VOCAB = 'model stream backpressure token queue worker tensor batch trace signal latency throughput embedding retrieval answer prompt'.split(' ');
/** 12–30 words: 80–220 hashed features, a realistic sentence-embedding input. */
const textOf = (i: number) => Array.from({ length: 12 + (i % 19) }, (_, j) => VOCAB[(i * 31 + j * 7) % VOCAB.length]).join(' ');
const texts = Array.from({ length: ITEMS }, (_, i) => textOf(i));

const HEAVY_IDS = Array.from({ length: 8 }, (_, salt) =>
  BigInt64Array.from({ length: HEAVY_ROWS * HEAVY_SEQ }, (_, i) => BigInt(1 + ((i * 7919 + salt) % 4000))),
);
const HEAVY_MASK = new BigInt64Array(HEAVY_ROWS * HEAVY_SEQ).fill(1n);
/** The same ids in shared memory, as `FeedBuffers` keeps them: the pool's workers read them in place (onnxruntime on this thread refuses shared memory). */
const inShared = (data: BigInt64Array) => {
  const shared = new BigInt64Array(new SharedArrayBuffer(data.byteLength));
  shared.set(data);
  return shared;
};
const SHARED_IDS = HEAVY_IDS.map(inShared);
const SHARED_MASK = inShared(HEAVY_MASK);
/** Built ahead, so the main thread does no tokenizing here; reused by every run (inline: ordinary memory, pool: shared). */
function heavyFeeds(salt: number, shared: boolean): Feeds {
  return {
    input_ids: new ort.Tensor('int64', (shared ? SHARED_IDS : HEAVY_IDS)[salt % HEAVY_IDS.length]!, [HEAVY_ROWS, HEAVY_SEQ]),
    attention_mask: new ort.Tensor('int64', shared ? SHARED_MASK : HEAVY_MASK, [HEAVY_ROWS, HEAVY_SEQ]),
  };
}

const percentile = (sorted: ArrayLike<number>, p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] ?? NaN;
const ms = (x: number) => x.toFixed(2);
const settle = () => new Promise((resolve) => setTimeout(resolve, 100));

/** Keeps `inFlight` runs going for LOAD_MS; returns event-loop delay p99/max (ms) and runs per second. */
async function loopDelayUnderLoad(run: (salt: number) => Promise<unknown>, inFlight: number): Promise<{ p99: number; max: number; runsPerSecond: number }> {
  globalThis.gc?.();
  const histogram = monitorEventLoopDelay({ resolution: 1 });
  let runs = 0;
  const end = performance.now() + LOAD_MS;
  histogram.enable();
  await Promise.all(
    Array.from({ length: inFlight }, async (_, lane) => {
      while (performance.now() < end) await run(lane * 1_000 + runs++);
    }),
  );
  histogram.disable();
  return { p99: histogram.percentile(99) / 1e6, max: histogram.max / 1e6, runsPerSecond: runs / (LOAD_MS / 1000) };
}

/** Every text through `infer` as fast as the pipeline pulls; returns elements per second. */
async function saturate(pool: InferencePool, maxBatch: number, count = ITEMS): Promise<number> {
  globalThis.gc?.();
  const start = performance.now();
  const done = await lastValueFrom(
    fromIterable(texts.slice(0, count)).pipe(
      infer({
        pool,
        toFeeds: (batch: Batch<string>) => textFeeds(tokenizer, batch.items, undefined, buffers),
        fromOutputs: (outputs) => tensorRows(outputs.embeddings!),
        maxBatch,
        maxWait: MAX_WAIT,
        groupBySequenceLength: { length: (text: string) => tokenizer.encode(text).length, bucket: 64 },
      }),
      reduce((n, { value }) => (Number.isFinite(value[0]) ? n + 1 : n), 0),
    ),
  );
  if (done !== count) throw new Error(`lost elements: ${done} of ${count}`);
  return count / ((performance.now() - start) / 1000);
}

/**
 * The "batch service time": median time to serve one full batch as `infer` does it,
 * tokenising and building the feeds on this thread and then the pool run (the same
 * span the stage records as its service time).
 */
async function batchServiceTime(pool: InferencePool): Promise<number> {
  const times: number[] = [];
  for (let i = 0; i < 60; i++) {
    const start = performance.now();
    await pool.run(textFeeds(tokenizer, texts.slice(i * MAX_BATCH, (i + 1) * MAX_BATCH), undefined, buffers));
    times.push(performance.now() - start);
  }
  return percentile(
    times.sort((a, b) => a - b),
    0.5,
  );
}

/**
 * Open loop: arrivals on a fixed schedule at `rate`/s, whatever the pipeline does. Each
 * element's latency runs from when it was due (so an arrival held back by a busy thread or
 * by backpressure still counts: no coordinated omission) or, if the timer let it in early,
 * from when it actually entered; it ends when the element reaches the subscriber.
 */
async function latencyUnderLoad(pool: InferencePool, rate: number, count: number, borrowOutputs: boolean): Promise<{ p50: number; p99: number }> {
  globalThis.gc?.();
  const start = performance.now() + 20;
  const due = (i: number) => start + (i * 1000) / rate;
  const entered = new Float64Array(count);
  async function* arrivals(): AsyncGenerator<number> {
    for (let i = 0; i < count; i++) {
      const wait = due(i) - performance.now();
      if (wait > 1) await new Promise((resolve) => setTimeout(resolve, wait));
      entered[i] = performance.now();
      yield i;
    }
  }
  // Written into a typed array: a list of numbers would box each one on the heap, and the GC
  // work of keeping them would land on the very latencies being measured.
  const latencies = new Float64Array(count);
  const received = await firstValueFrom(
    fromAsyncIterable(arrivals()).pipe(
      infer({
        pool,
        toFeeds: (batch: Batch<number>) =>
          textFeeds(
            tokenizer,
            batch.items.map((i) => texts[i % ITEMS]!),
            undefined,
            buffers,
          ),
        fromOutputs: (outputs, batch) => tensorRows(outputs.embeddings!).map((row, j) => (Number.isFinite(row[0]) ? batch.items[j]! : NaN)),
        maxBatch: MAX_BATCH,
        maxWait: MAX_WAIT,
        borrowOutputs,
      }),
      reduce((n, { value: i }) => {
        latencies[n] = performance.now() - Math.max(due(i), entered[i]!);
        return n + 1;
      }, 0),
    ),
  );
  if (received !== count || latencies.some(Number.isNaN)) throw new Error(`lost elements: ${received} of ${count}`);
  latencies.sort();
  return { p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99) };
}

async function main(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'sluice-bench-inference-'));
  const modelPath = join(dir, 'embed.onnx');
  await writeFile(modelPath, buildEmbeddingModel(EMBEDDING_CONFIG));
  const rows: string[][] = [];
  const log = (line: string) => console.error(line);
  log(`node ${process.version}, ${availableParallelism()} cores, model ${EMBEDDING_CONFIG.dim}-dim embedding (generated)`);

  // 1. Event-loop delay.
  const inline = await ort.InferenceSession.create(modelPath, { executionProviders: ['cpu'], intraOpNumThreads: 1 });
  const inlineLoad = await loopDelayUnderLoad((salt) => inline.run(heavyFeeds(salt, false)), 2);
  await inline.release();
  log(`inline: p99 ${ms(inlineLoad.p99)} ms`);
  const pool1 = await InferencePool.create({ model: modelPath, size: 1 });
  const pool2 = await InferencePool.create({ model: modelPath, size: 2 });
  await settle();
  const pool1Load = await loopDelayUnderLoad((salt) => pool1.run(heavyFeeds(salt, true)), 2);
  const pool2Load = await loopDelayUnderLoad((salt) => pool2.run(heavyFeeds(salt, true)), 4);
  log(`pool: p99 ${ms(pool1Load.p99)} / ${ms(pool2Load.p99)} ms`);
  rows.push(
    [
      'event-loop delay p99, `session.run` inline on the main thread',
      `${ms(inlineLoad.p99)} ms (max ${ms(inlineLoad.max)}; ${inlineLoad.runsPerSecond.toFixed(0)} runs/s)`,
      '—',
    ],
    [
      'event-loop delay p99, InferencePool size 1',
      `${ms(pool1Load.p99)} ms (max ${ms(pool1Load.max)}; ${pool1Load.runsPerSecond.toFixed(0)} runs/s)`,
      pool1Load.p99 < 5 ? '< 5 ms ✓' : '< 5 ms ✗',
    ],
    [
      'event-loop delay p99, InferencePool size 2',
      `${ms(pool2Load.p99)} ms (max ${ms(pool2Load.max)}; ${pool2Load.runsPerSecond.toFixed(0)} runs/s)`,
      pool2Load.p99 < 5 ? '< 5 ms ✓' : '< 5 ms ✗',
    ],
  );

  // 2. Batched vs one per run, at saturation (pool of 2).
  await saturate(pool2, MAX_BATCH, 500); // warm-up
  const batched = await saturate(pool2, MAX_BATCH);
  const single = await saturate(pool2, 1, 2_000);
  log(`throughput: batched ${batched.toFixed(0)}/s, single ${single.toFixed(0)}/s`);
  rows.push(
    [`throughput, infer maxBatch ${MAX_BATCH} (pool size 2)`, `${batched.toFixed(0)} elements/s`, ''],
    ['throughput, infer maxBatch 1 (one element per run)', `${single.toFixed(0)} elements/s`, ''],
    ['batched / one per run', `${(batched / single).toFixed(1)}×`, batched / single >= 3 ? '≥ 3× ✓' : '≥ 3× ✗'],
  );

  // 3. Latency under an open-loop load, against maxWait + 2 × batch service time. On one
  // worker: with two on a 2-core machine the main thread (arrivals, tokenising, batching,
  // timers) has no core of its own and its timers fire late, which is the machine, not the batcher.
  await saturate(pool1, MAX_BATCH, 500); // warm-up
  const capacity = await saturate(pool1, MAX_BATCH);
  const service = await batchServiceTime(pool1);
  const bound = MAX_WAIT + 2 * service;
  rows.push([`batch service time (median of ${MAX_BATCH} texts: feeds + pool run, 1 worker)`, `${ms(service)} ms`, '']);
  // Half and a quarter of capacity, plus the hardest point for a batcher: the rate at which a
  // batch fills exactly when maxWait ends, so every batch is both full and as old as it gets.
  const fillsAtMaxWait = Math.round((MAX_BATCH * 1000) / MAX_WAIT);
  const loads = [
    { rate: Math.round(capacity * 0.5), what: "50% of 1 worker's batched capacity" },
    { rate: Math.round(capacity * 0.25), what: "25% of 1 worker's batched capacity" },
    ...(fillsAtMaxWait < capacity
      ? [{ rate: fillsAtMaxWait, what: `${MAX_BATCH} arrivals per maxWait, ${((fillsAtMaxWait / capacity) * 100).toFixed(0)}% of capacity` }]
      : []),
  ];
  // Borrowed outputs (`borrowOutputs`: read in the worker's shared arena), as a latency-
  // sensitive pipeline that keeps only what it derives runs; then, for comparison, the
  // half load again with a fresh output buffer per batch (48 KB of external memory each,
  // which drives V8 into a full GC every second or so: the README's inference section).
  const phases = [...loads.map((load) => ({ ...load, borrow: true })), { ...loads[0]!, what: `${loads[0]!.what}, fresh output buffers`, borrow: false }];
  // Warm-up, one second of each mode unmeasured: the phases measure steady state, not the
  // JIT compiling the borrowed path (which otherwise lands on whichever phase runs it first).
  for (const borrow of [true, false]) await latencyUnderLoad(pool1, loads[0]!.rate, loads[0]!.rate, borrow);
  for (const { rate, what, borrow } of phases) {
    const latency = await latencyUnderLoad(pool1, rate, rate * LATENCY_SECONDS, borrow);
    log(`latency at ${rate}/s${borrow ? '' : ' (fresh outputs)'}: p99 ${ms(latency.p99)} ms vs bound ${ms(bound)}`);
    rows.push([
      `element latency at ${rate}/s open loop (${what}), p50 / p99`,
      `${ms(latency.p50)} / ${ms(latency.p99)} ms`,
      `${latency.p99 <= bound ? '≤' : '>'} ${ms(bound)} ms ${latency.p99 <= bound ? '✓' : '✗'}${borrow ? '' : ' (comparison)'}`,
    ]);
  }

  // 4. Workers: 1 vs 2.
  await saturate(pool1, MAX_BATCH, 500);
  const one = await saturate(pool1, MAX_BATCH);
  const two = await saturate(pool2, MAX_BATCH);
  log(`workers: 1 → ${one.toFixed(0)}/s, 2 → ${two.toFixed(0)}/s`);
  rows.push(
    ['batched throughput, 1 worker', `${one.toFixed(0)} elements/s`, ''],
    ['batched throughput, 2 workers', `${two.toFixed(0)} elements/s`, `${(two / one).toFixed(2)}×`],
  );

  await Promise.all([pool1.close(), pool2.close()]);
  await rm(dir, { recursive: true, force: true });

  console.log(`\n\`${COMMAND}\` — Node ${process.version}, ${availableParallelism()} cores\n`);
  console.log('| measure | result | target |');
  console.log('|---|---|---|');
  for (const [measure, result, target] of rows) console.log(`| ${measure} | ${result} | ${target} |`);
  console.log(
    `\nEvent-loop phase: ${HEAVY_ROWS}×${HEAVY_SEQ}-token runs kept in flight for ${LOAD_MS / 1000} s. Throughput: ${ITEMS} texts of 12–30 words, maxWait ${MAX_WAIT} ms, grouped by 64-token length buckets.`,
  );
}

await main();
