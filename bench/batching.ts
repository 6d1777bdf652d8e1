/**
 * Continuous batching through the HTTP API: `sluice serve` in a child process streaming `charlm`
 * to 1, 4 and 16 concurrent clients (closed loop), with its decode steps batched (`--max-batch 16`)
 * and each step alone (`--max-batch 1`, how it served before); the same for bench 11's decoder served
 * with `--model`, its clients' prompts of different lengths. Tokens per second, and the ratios
 * that matter: 16 streams ÷ 1 stream batched (target ≥ 4×) and batched ÷ alone at 16 streams. Then a
 * generated 6x512 KV-cache decoder in a 2-thread pool at 1, 4, 16 and 64 streams, short and long
 * prompts, and its single-step ceiling (bench/decode-ceiling.ts), each run read against it.
 *
 *     node --conditions=sluice-source --import tsx bench/batching.ts
 *
 * Environment: BENCH_BATCH_SECONDS=4 (per point), BENCH_BATCH_TOKENS=64 (per request).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { Agent, request as httpRequest } from 'node:http';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { envInt, monotonicMs, selected, target, textTable, type TargetCheck } from './harness.js';
import { startServe } from './overload.js';
import { BENCH_DECODER, writeDecoderDir } from './decoder-dir.js';
import { type CeilingResult, ceilingAt, measureDecodeCeiling } from './decode-ceiling.js';

export const BATCHING_IDS = ['batching-charlm-batched', 'batching-charlm-alone', 'batching-decoder-served', 'batching-decoder-served-alone'] as const;
/** The HTTP runs: which model, and whether its decode steps are batched. The decoder is bench 11's 6x512 one, served with `--model`. */
const SERVED: Readonly<Record<(typeof BATCHING_IDS)[number], { readonly model: 'charlm' | 'decoder'; readonly batched: boolean }>> = {
  'batching-charlm-batched': { model: 'charlm', batched: true },
  'batching-charlm-alone': { model: 'charlm', batched: false },
  'batching-decoder-served': { model: 'decoder', batched: true },
  'batching-decoder-served-alone': { model: 'decoder', batched: false },
};
const STREAMS = [1, 4, 16] as const;
/** The decoder also at 64 streams: four full batches of `maxBatch` 16. */
const DECODER_STREAMS = [1, 4, 16, 64] as const;
const COLUMNS = DECODER_STREAMS;

export interface BatchingResult {
  readonly id: string;
  /** Tokens per second by concurrent streams. */
  readonly tokensPerSecond: Readonly<Record<number, number>>;
  /** p99 gap between one client's tokens (ms), by concurrent streams (HTTP runs). */
  readonly gapP99?: Readonly<Record<number, number>>;
}

/** The stopped-readers run: 18 reading clients alone, then beside 2 that stopped reading (10 %). */
export interface StoppedReadersResult {
  readonly readersAlone: number;
  readonly readersBesideStopped: number;
}

/** Tokens of one streamed completion; the gap before each token after the first goes to `gaps` (ms). */
function stream(url: URL, agent: Agent, tokens: number, gaps: number[] = [], model = 'charlm', prompt = 'The stage'): Promise<number> {
  const body = JSON.stringify({ model, stream: true, max_tokens: tokens, messages: [{ role: 'user', content: prompt }] });
  return new Promise((resolve) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: '/v1/chat/completions', method: 'POST', agent, headers: { 'content-type': 'application/json' } },
      (res) => {
        let count = 0;
        let last = 0;
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          const now = monotonicMs();
          for (let at = chunk.indexOf('"content"'); at >= 0; at = chunk.indexOf('"content"', at + 1)) {
            if (count > 0) gaps.push(now - last);
            last = now;
            count++;
          }
        });
        res.on('end', () => resolve(res.statusCode === 200 ? count : 0));
      },
    );
    req.on('error', () => resolve(0));
    req.end(body);
  });
}

/** Tokens per second of `streams` closed-loop clients, and the p50 and p99 gaps between one client's tokens (ms). */
async function measure(
  url: URL,
  streams: number,
  seconds: number,
  tokens: number,
  model = 'charlm',
): Promise<{ tokensPerSecond: number; gapP50: number; gapP99: number }> {
  // The decoder's clients send prompts of different lengths, so their contexts differ as real ones do.
  const promptOf = (client: number) => (model === 'charlm' ? 'The stage' : `The stage${' x'.repeat(client % 8)}`);
  const agent = new Agent({ keepAlive: true, maxSockets: streams });
  let total = 0;
  const gaps: number[] = [];
  const until = monotonicMs() + seconds * 1000;
  const started = monotonicMs();
  await Promise.all(
    Array.from({ length: streams }, async (_, client) => {
      while (monotonicMs() < until) {
        // Read before adding: `total += await ...` would read `total` before the await and lose the other clients' counts.
        const seen = await stream(url, agent, tokens, gaps, model, promptOf(client));
        total += seen;
      }
    }),
  );
  agent.destroy();
  gaps.sort((a, b) => a - b);
  const gapAt = (q: number) => gaps[Math.floor(gaps.length * q)] ?? 0;
  return { tokensPerSecond: total / ((monotonicMs() - started) / 1000), gapP50: gapAt(0.5), gapP99: gapAt(0.99) };
}

/** Opens `count` streams whose clients read nothing (paused), for as long as `during` runs. */
async function withStoppedReaders<T>(url: URL, count: number, during: () => Promise<T>): Promise<T> {
  const agent = new Agent({ keepAlive: false, maxSockets: count });
  const body = JSON.stringify({ model: 'charlm', stream: true, max_tokens: 1_000_000, messages: [{ role: 'user', content: 'The stage' }] });
  const requests = Array.from({ length: count }, () => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: '/v1/chat/completions', method: 'POST', agent, headers: { 'content-type': 'application/json' } },
      (res) => res.pause(),
    );
    req.on('error', () => {});
    req.end(body);
    return req;
  });
  // Long enough for their socket buffers to fill: from then on only demand would make the model step for them.
  await new Promise((resolve) => setTimeout(resolve, 1000));
  try {
    return await during();
  } finally {
    for (const req of requests) req.destroy();
    agent.destroy();
  }
}

export async function measureBatching(onProgress: (message: string) => void = () => {}): Promise<{ results: BatchingResult[]; checks: TargetCheck[] }> {
  const seconds = envInt('BENCH_BATCH_SECONDS', 4);
  const tokens = envInt('BENCH_BATCH_TOKENS', 64);
  const models = await mkdtemp(join(tmpdir(), 'sluice-bench-batching-'));
  const results: BatchingResult[] = [];
  let stopped: StoppedReadersResult | undefined;
  try {
    for (const id of BATCHING_IDS.filter((i) => selected(i))) {
      const { model, batched } = SERVED[id];
      const flags = ['--max-batch', batched ? '16' : '1'];
      if (model === 'decoder') {
        const dir = join(models, 'decoder');
        await writeDecoderDir(dir, BENCH_DECODER);
        flags.push('--model', dir);
      }
      const { child, url } = await startServe(models, 64, 256, flags);
      try {
        const base = new URL(url);
        await measure(base, 4, 1, tokens, model); // warm-up
        const perStreams: Record<number, number> = {};
        const gapP99: Record<number, number> = {};
        for (const n of STREAMS) {
          const { tokensPerSecond, gapP50, gapP99: gap } = await measure(base, n, seconds, tokens, model);
          perStreams[n] = tokensPerSecond;
          gapP99[n] = gap;
          onProgress(`${id}: ${n} streams, ${tokensPerSecond.toFixed(0)} tokens/s, inter-token p50 ${gapP50.toFixed(2)} ms, p99 ${gap.toFixed(2)} ms`);
        }
        results.push({ id, tokensPerSecond: perStreams, gapP99 });
        if (id === 'batching-charlm-batched') {
          const readersAlone = (await measure(base, 18, seconds, tokens)).tokensPerSecond;
          const readersBesideStopped = (await withStoppedReaders(base, 2, () => measure(base, 18, seconds, tokens))).tokensPerSecond;
          stopped = { readersAlone, readersBesideStopped };
          onProgress(`${id}: 18 readers ${readersAlone.toFixed(0)} tokens/s alone, ${readersBesideStopped.toFixed(0)} beside 2 stopped readers`);
        }
      } finally {
        child.kill('SIGTERM');
        await new Promise((resolve) => child.once('exit', resolve));
      }
    }
  } finally {
    await rm(models, { recursive: true, force: true });
  }
  const batched = results.find((r) => r.id === 'batching-charlm-batched');
  const alone = results.find((r) => r.id === 'batching-charlm-alone');
  const checks: TargetCheck[] = [];
  if (batched !== undefined)
    checks.push(target('charlm over HTTP: 16 streams ÷ 1 stream, tokens/s, batched', batched.tokensPerSecond[16]! / batched.tokensPerSecond[1]!, '×', 'ge', 4));
  if (batched?.gapP99 !== undefined)
    checks.push(target('charlm over HTTP: inter-token p99, 16 streams ÷ 1 stream', batched.gapP99[16]! / Math.max(batched.gapP99[1]!, 0.001), '×', 'le', 2.5));
  if (stopped !== undefined)
    checks.push(
      target('charlm over HTTP: 18 readers beside 2 stopped ÷ alone, tokens/s', stopped.readersBesideStopped / stopped.readersAlone, '×', 'ge', 0.95),
    );
  const served = results.find((r) => r.id === 'batching-decoder-served');
  const servedAlone = results.find((r) => r.id === 'batching-decoder-served-alone');
  if (served !== undefined) {
    checks.push(target('decoder served over HTTP: 16 streams ÷ 1 stream, tokens/s', served.tokensPerSecond[16]! / served.tokensPerSecond[1]!, '×', 'ge', 5));
    checks.push(
      target('decoder served over HTTP: inter-token p99, 16 streams ÷ 1 stream', served.gapP99![16]! / Math.max(served.gapP99![1]!, 0.001), '×', 'le', 2.5),
    );
  }
  if (served !== undefined && servedAlone !== undefined)
    checks.push(
      target(
        'decoder served over HTTP at 16 streams: batched ÷ each step alone, tokens/s',
        served.tokensPerSecond[16]! / servedAlone.tokensPerSecond[16]!,
        '×',
        'ge',
        3,
      ),
    );
  if (batched !== undefined && alone !== undefined)
    // Batching must not cost: 0.95 leaves room for run-to-run noise on a shared 2-core machine.
    checks.push(
      target('charlm over HTTP at 16 streams: batched ÷ each step alone, tokens/s', batched.tokensPerSecond[16]! / alone.tokensPerSecond[16]!, '×', 'ge', 0.95),
    );
  return { results, checks };
}

export function batchingReport(results: readonly BatchingResult[], checks: readonly TargetCheck[]): string {
  const cell = (v: number | undefined, digits: number) => (v === undefined ? '–' : v.toFixed(digits));
  const rows = results.map((r) => [r.id, ...COLUMNS.map((n) => cell(r.tokensPerSecond[n], 0))]);
  const judged = checks.map((c) => [c.what, c.measured.toFixed(2), `${c.comparison === 'le' ? '≤' : '≥'} ${c.limit}`, c.pass ? 'PASS' : 'MISS']);
  const gapRows = results.filter((r) => r.gapP99 !== undefined).map((r) => [r.id, ...COLUMNS.map((n) => cell(r.gapP99![n], 2))]);
  return `${textTable(['server', ...COLUMNS.map((n) => `${n} streams tokens/s`)], rows)}\n${textTable(['server', ...COLUMNS.map((n) => `${n} streams inter-token p99 ms`)], gapRows)}\n${textTable(['ratio', 'measured', 'target', ''], judged)}\nload average ${loadavg()[0]!.toFixed(1)}`;
}

/** The decoder the issue measured one step of: 6 layers, hidden 512, FFN 2,048, vocabulary 8,192 (about 110 MB). */
export const DECODER_IDS = [
  'batching-decoder-batched',
  'batching-decoder-travelling',
  'batching-decoder-alone',
  'batching-decoder-mixed-exact',
  'batching-decoder-mixed-padded',
  'batching-decoder-long',
  'batching-decoder-long-alone',
] as const;

/**
 * How each decoder id batches, whether its prompts have mixed lengths (0–7 extra characters), and whether
 * its KV caches stay in the pool's threads (`resident`) or travel with every step (`travelling`, as before).
 */
const DECODER_RUNS: Readonly<
  Record<
    (typeof DECODER_IDS)[number],
    {
      readonly batch?: { maxBatch: number; concurrency: number; lengthBucket?: number };
      readonly mixed: boolean;
      readonly resident?: boolean;
      readonly long?: boolean;
    }
  >
> = {
  'batching-decoder-batched': { batch: { maxBatch: 16, concurrency: 2 }, mixed: false, resident: true },
  'batching-decoder-travelling': { batch: { maxBatch: 16, concurrency: 2 }, mixed: false },
  'batching-decoder-alone': { mixed: false },
  'batching-decoder-mixed-exact': { batch: { maxBatch: 16, concurrency: 2 }, mixed: true, resident: true },
  'batching-decoder-mixed-padded': { batch: { maxBatch: 16, concurrency: 2, lengthBucket: 64 }, mixed: true, resident: true },
  'batching-decoder-long': { batch: { maxBatch: 16, concurrency: 2 }, mixed: false, resident: true, long: true },
  'batching-decoder-long-alone': { mixed: false, long: true },
};

/** A long run's prompt: its past grows from about this many positions to this plus the tokens asked. */
const LONG_PROMPT = 224;

function promptFor(i: number, run: { readonly mixed: boolean; readonly long?: boolean }): string {
  const prompt = `Prompt number ${String(i).padStart(2, '0')} ${run.mixed ? '#'.repeat(i % 8) : ''}`;
  return run.long === true ? prompt.padEnd(LONG_PROMPT, '.') : prompt;
}

/** Tokens/s of `streams` concurrent generations on a KV-cache decoder in a 2-thread pool, steps batched or alone; and the model's single-step ceiling. */
export async function measureDecoderBatching(
  onProgress: (message: string) => void = () => {},
): Promise<{ results: BatchingResult[]; checks: TargetCheck[]; ceiling: CeilingResult[] }> {
  const { buildDecoderModel } = await import('../src/ai/models/decoder.js');
  const { InferencePool } = await import('../src/ai/pool/pool.js');
  const { DecoderLmWorker } = await import('../src/ai/inference/onnx-lm.js');
  const { generateRequest } = await import('../src/ai/inference/worker.js');
  const { writeFile } = await import('node:fs/promises');
  const tokens = envInt('BENCH_DECODER_TOKENS', 48);
  const dir = await mkdtemp(join(tmpdir(), 'sluice-bench-decoder-'));
  const path = join(dir, 'decoder.onnx');
  await writeFile(path, buildDecoderModel(BENCH_DECODER));
  const pool = await InferencePool.create({ name: 'bench-decoder', models: { decoder: path }, size: 2 });
  const results: BatchingResult[] = [];
  let ceiling: CeilingResult[] = [];
  try {
    const shape = {
      layers: BENCH_DECODER.layers,
      heads: BENCH_DECODER.heads,
      headDim: BENCH_DECODER.hidden / BENCH_DECODER.heads,
      maxPositions: BENCH_DECODER.maxPositions,
    };
    const codec = {
      encode: (text: string) => Array.from(text, (ch) => ch.charCodeAt(0) % BENCH_DECODER.vocabSize),
      decode: (id: number) => String.fromCharCode(32 + (id % 90)),
    };
    for (const id of DECODER_IDS.filter((i) => selected(i))) {
      const worker = new DecoderLmWorker({
        shape,
        codec,
        run: (feeds, signal) => pool.run(feeds, { model: 'decoder', signal }),
        ...(DECODER_RUNS[id].batch !== undefined && { batch: DECODER_RUNS[id].batch }),
        ...(DECODER_RUNS[id].resident === true && { resident: { pool, model: 'decoder' } }),
      });
      const perStreams: Record<number, number> = {};
      const gapP99: Record<number, number> = {};
      // Warm-up: the pool's sessions and this worker's code paths, so the first figure measured is not the cold one.
      await Promise.all([0, 1].map((i) => worker.infer(generateRequest({ prompt: `Warm-up ${i}`, max_tokens: 8, temperature: 0 }))));
      for (const n of DECODER_STREAMS) {
        // One prompt length: every generation's cache has the same length at each step, so they batch; mixed: only when padded.
        const started = monotonicMs();
        const gaps: number[] = [];
        const made = await Promise.all(
          Array.from(
            { length: n },
            (_, i) =>
              new Promise<number>((resolve, reject) => {
                let count = 0;
                let last = 0;
                worker
                  .generate(
                    generateRequest({
                      prompt: promptFor(i, DECODER_RUNS[id]),
                      max_tokens: tokens,
                      temperature: 0,
                    }),
                  )
                  .subscribe({
                    next: () => {
                      const now = monotonicMs();
                      if (count++ > 0) gaps.push(now - last);
                      last = now;
                    },
                    error: reject,
                    complete: () => resolve(count),
                  });
              }),
          ),
        );
        perStreams[n] = made.reduce((sum, c) => sum + c, 0) / ((monotonicMs() - started) / 1000);
        gaps.sort((a, b) => a - b);
        gapP99[n] = gaps[Math.floor(gaps.length * 0.99)] ?? 0;
        onProgress(`${id}: ${n} streams, ${perStreams[n]!.toFixed(0)} tokens/s, inter-token p99 ${gapP99[n]!.toFixed(1)} ms`);
      }
      results.push({ id, tokensPerSecond: perStreams, gapP99 });
    }
    if (selected('batching-decoder-ceiling')) {
      ceiling = await measureDecodeCeiling(pool, 'decoder', shape);
      for (const c of ceiling)
        onProgress(`ceiling: past ${c.past}, ${c.sequences} sequences in ${c.calls} call(s): ${c.ms.toFixed(1)} ms, ${c.tokensPerSecond.toFixed(0)} tokens/s`);
    }
  } finally {
    await pool.close();
    await rm(dir, { recursive: true, force: true });
  }
  const batched = results.find((r) => r.id === 'batching-decoder-batched');
  const alone = results.find((r) => r.id === 'batching-decoder-alone');
  const checks: TargetCheck[] = [];
  if (batched !== undefined)
    checks.push(target('decoder (6x512): 16 streams ÷ 1 stream, tokens/s, batched', batched.tokensPerSecond[16]! / batched.tokensPerSecond[1]!, '×', 'ge', 5));
  if (batched !== undefined && alone !== undefined)
    checks.push(
      target('decoder (6x512) at 16 streams: batched ÷ each step alone, tokens/s', batched.tokensPerSecond[16]! / alone.tokensPerSecond[16]!, '×', 'ge', 3),
    );
  if (batched?.gapP99 !== undefined)
    checks.push(target('decoder (6x512): inter-token p99, 16 streams ÷ 1 stream', batched.gapP99[16]! / Math.max(batched.gapP99[1]!, 0.001), '×', 'le', 2.5));
  const exact = results.find((r) => r.id === 'batching-decoder-mixed-exact');
  const padded = results.find((r) => r.id === 'batching-decoder-mixed-padded');
  if (exact !== undefined && padded !== undefined)
    checks.push(
      target(
        'decoder (6x512), 16 streams of mixed lengths: padded ÷ one length per call',
        padded.tokensPerSecond[16]! / exact.tokensPerSecond[16]!,
        '×',
        'ge',
        1.5,
      ),
    );
  return { results, checks, ceiling };
}

/** The ceiling, and how far the served streams get from it at 1 and 16 streams (short runs: past 32, about their mean; long runs: past 256). */
export function ceilingReport(results: readonly BatchingResult[], ceiling: readonly CeilingResult[]): string {
  if (ceiling.length === 0) return '';
  const steps = textTable(
    ['past', 'sequences', 'calls at once', 'ms per step', 'tokens/s', '÷ 1 sequence'],
    ceiling.map((c) => [
      String(c.past),
      String(c.sequences),
      String(c.calls),
      c.ms.toFixed(1),
      c.tokensPerSecond.toFixed(0),
      `${(c.tokensPerSecond / (ceilingAt(ceiling, c.past, 1) ?? Number.NaN)).toFixed(2)}×`,
    ]),
  );
  const rows: string[][] = [];
  for (const r of results.filter((x) => x.id.startsWith('batching-decoder-'))) {
    const past = r.id.includes('-long') ? 256 : 32;
    for (const n of [1, 16]) {
      const top = ceilingAt(ceiling, past, n);
      const got = r.tokensPerSecond[n];
      if (top !== undefined && got !== undefined)
        rows.push([r.id, String(n), String(past), got.toFixed(0), top.toFixed(0), `${((100 * got) / top).toFixed(0)} %`]);
    }
  }
  return `${steps}
${textTable(['run', 'streams', 'ceiling at past', 'tokens/s', 'ceiling tokens/s', 'of the ceiling'], rows)}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const http = await measureBatching((m) => process.stderr.write(`${m}\n`));
  const decoder = await measureDecoderBatching((m) => process.stderr.write(`${m}\n`));
  console.log(batchingReport([...http.results, ...decoder.results], [...http.checks, ...decoder.checks]));
  console.log(ceilingReport(decoder.results, decoder.ceiling));
}
