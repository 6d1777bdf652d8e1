/**
 * Overload: `sluice serve` in a child process first unloaded, then
 * its capacity measured with closed-loop clients, then offered 10× that rate open-loop. Reported:
 * the server's RSS before and after the overload, how fast refusals come back (429 at the door),
 * admitted requests' time to first token against the unloaded one, refusals the server counted
 * against those the clients saw, and whether it stayed up.
 *
 *     node --conditions=sluice-source --import tsx bench/overload.ts
 *
 * Environment: BENCH_OVERLOAD_SECONDS=20 (the figure is for 60), BENCH_OVERLOAD_FACTOR=10,
 * BENCH_OVERLOAD_STREAMS=8 (--max-streams), BENCH_OVERLOAD_QUEUE=32 (--max-queue), BENCH_OVERLOAD_TOKENS=32,
 * BENCH_OVERLOAD_WAIT=20 (--max-queue-wait in ms, about one unloaded time to first token: the
 * latency-first setting the time-to-first-token bound asks for; 0 leaves it off).
 *
 * Two models: `charlm` (tiny per token, so the HTTP edge is what saturates) and bench 11's 6×512
 * decoder served with `--model` (the model's steps saturate the pool's threads), ids
 * `overload-serve` and `overload-serve-decoder`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { Agent } from 'node:http';
import { Worker } from 'node:worker_threads';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { BENCH_DECODER, writeDecoderDir } from './decoder-dir.js';
import { complete, type LoadPlan, type LoadReport, type Outcome } from './offer-load.js';
import { envInt, formatMB, monotonicMs, percentile, target, textTable, type TargetCheck } from './harness.js';

export const OVERLOAD_IDS = { charlm: 'overload-serve', decoder: 'overload-serve-decoder' } as const;
export type OverloadModel = keyof typeof OVERLOAD_IDS;

export interface OverloadResult {
  readonly id: string;
  readonly model: OverloadModel;
  readonly capacity: number;
  readonly offered: number;
  readonly seconds: number;
  readonly admitted: number;
  readonly refused: number;
  readonly failed: number;
  readonly refusalP99: number;
  readonly ttftUnloadedP99: number;
  readonly ttftLoadedP99: number;
  readonly rssBefore: number;
  readonly rssAfter: number;
  readonly rssPeak: number;
  readonly shedCounted: number;
  readonly alive: boolean;
  /** The load threads' own event-loop delay p99, ms: the floor under the refusal times they measure. */
  readonly loopDelayP99: number;
  /** The server's own time over a refusal p99, ms, from its request log (a sample: at most 10 lines a second). */
  readonly refusalInServerP99: number;
}

const root = fileURLToPath(new URL('../', import.meta.url));

/** A bench's server: its process, its URL, and how long it took over each refusal it logged (ms, at most 10 a second). */
export interface BenchServer {
  readonly child: ChildProcess;
  readonly url: string;
  readonly refusalsLogged: number[];
}

export async function startServe(models: string, streams: number, queue: number, extra: readonly string[] = []): Promise<BenchServer> {
  const child = spawn(
    process.execPath,
    [
      // e.g. `--cpu-prof --cpu-prof-dir=prof`, to profile the server a bench drives.
      ...(process.env.BENCH_SERVE_NODE_ARGS?.split(' ').filter(Boolean) ?? []),
      join(root, 'bin', 'sluice.js'),
      'serve',
      '--port',
      '0',
      '--models',
      models,
      '--max-streams',
      String(streams),
      '--max-queue',
      String(queue),
      '--no-inspect',
      ...extra,
      // e.g. `--pool-nice 10`, for every server a bench starts.
      ...(process.env.BENCH_SERVE_FLAGS?.split(' ').filter(Boolean) ?? []),
    ],
    // The door is what is measured: the tenant's own limits are set out of the way.
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, SLUICE_TENANT_CONCURRENT: '100000', SLUICE_TENANT_RATE: '1000000' } },
  );
  let out = '';
  child.stdout!.on('data', (chunk: Buffer) => (out += chunk.toString()));
  // BENCH_SERVE_STDERR=file keeps the server's log (its request lines time each request from the server's side).
  const log = process.env.BENCH_SERVE_STDERR;
  const refusalsLogged: number[] = [];
  let partial = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    if (log !== undefined) appendFileSync(log, chunk);
    const lines = (partial + chunk.toString()).split('\n');
    partial = lines.pop()!;
    for (const line of lines) {
      if (!line.includes('"refused"')) continue;
      let entry: { request?: { outcome?: string; durationMs?: number } };
      try {
        entry = JSON.parse(line) as typeof entry;
      } catch {
        continue; // not a log line (a crash's stack)
      }
      if (entry.request?.outcome === 'refused' && entry.request.durationMs !== undefined) refusalsLogged.push(entry.request.durationMs);
    }
  });
  const deadline = Date.now() + 120_000;
  while (!/listening on (http:\/\/\S+)/.test(out)) {
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`sluice serve did not start: ${out}`);
    await sleep(50);
  }
  return { child, url: /listening on (http:\/\/\S+)/.exec(out)![1]!, refusalsLogged };
}

async function rssOf(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)?.[1] ?? 0) * 1024;
}

async function shedCounted(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  let total = 0;
  for (const line of text.split('\n')) if (line.startsWith('sluice_stage_shed_total{stage="intake"')) total += Number(line.split(' ').at(-1));
  return total;
}

export async function measureOverload(
  model: OverloadModel,
  onProgress: (message: string) => void = () => {},
): Promise<{ result: OverloadResult; checks: TargetCheck[] }> {
  const seconds = envInt('BENCH_OVERLOAD_SECONDS', 20);
  const factor = envInt('BENCH_OVERLOAD_FACTOR', 10);
  const streams = envInt('BENCH_OVERLOAD_STREAMS', 8);
  const queue = process.env.BENCH_OVERLOAD_QUEUE === '0' ? 0 : envInt('BENCH_OVERLOAD_QUEUE', 32);
  const tokens = envInt('BENCH_OVERLOAD_TOKENS', 32);
  const models = await mkdtemp(join(tmpdir(), 'sluice-bench-overload-'));
  const wait = process.env.BENCH_OVERLOAD_WAIT === '0' ? 0 : envInt('BENCH_OVERLOAD_WAIT', 20);
  const extra = wait > 0 ? ['--max-queue-wait', String(wait)] : [];
  if (model === 'decoder') {
    await writeDecoderDir(join(models, 'decoder'), BENCH_DECODER);
    extra.push('--model', join(models, 'decoder'));
  }
  const { child, url, refusalsLogged } = await startServe(models, streams, queue, extra);
  const target_ = new URL(url);
  const agent = new Agent({ keepAlive: true, maxSockets: 1024 });
  try {
    // Unloaded: one client at a time.
    const unloaded: Outcome[] = [];
    for (let i = 0; i < 60; i++) unloaded.push(await complete(target_, agent, model, tokens));
    // Capacity: as many closed-loop clients as streams, for a few seconds.
    let done = 0;
    const until = monotonicMs() + 4000;
    await Promise.all(
      Array.from({ length: streams }, async () => {
        while (monotonicMs() < until) if ((await complete(target_, agent, model, tokens)).status === 200) done++;
      }),
    );
    const capacity = done / 4;
    const offered = capacity * factor;
    onProgress(`overload (${model}): capacity ${capacity.toFixed(0)} requests/s; offering ${offered.toFixed(0)}/s for ${seconds} s`);
    const shedBefore = await shedCounted(url);
    const rssBefore = await rssOf(child.pid!);
    let rssPeak = rssBefore;
    const sampler = setInterval(
      () =>
        void rssOf(child.pid!)
          .then((rss) => (rssPeak = Math.max(rssPeak, rss)))
          .catch(() => {}),
      250,
    );
    // Several threads share the offered rate: one event loop starting and reading every request
    // would time the refusals by its own delay.
    const threads = envInt('BENCH_OVERLOAD_THREADS', 2);
    const plan: LoadPlan = { url, model, tokens, rate: offered / threads, seconds };
    const reports = await Promise.all(Array.from({ length: threads }, () => runLoad(plan)));
    const loaded = reports.flatMap((r) => r.outcomes);
    const loopDelayP99 = Math.max(...reports.map((r) => r.loopDelayP99));
    clearInterval(sampler);
    await sleep(500);
    const rssAfter = await rssOf(child.pid!);
    const alive =
      child.exitCode === null &&
      (await fetch(`${url}/healthz`)
        .then((r) => r.ok)
        .catch(() => false));
    const refusedOnes = loaded.filter((o) => o.status === 429 || o.status === 503);
    const admitted = loaded.filter((o) => o.status === 200);
    const sorted = (values: number[]) => Float64Array.from(values).sort();
    const result: OverloadResult = {
      id: OVERLOAD_IDS[model],
      model,
      capacity,
      offered,
      seconds,
      admitted: admitted.length,
      refused: refusedOnes.length,
      failed: loaded.length - admitted.length - refusedOnes.length,
      refusalP99: percentile(sorted(refusedOnes.map((o) => o.head)), 99),
      ttftUnloadedP99: percentile(sorted(unloaded.map((o) => o.firstToken ?? o.head)), 99),
      ttftLoadedP99: percentile(sorted(admitted.map((o) => o.firstToken ?? o.head)), 99),
      rssBefore,
      rssAfter,
      rssPeak,
      shedCounted: (await shedCounted(url)) - shedBefore,
      alive,
      loopDelayP99,
      refusalInServerP99: percentile(sorted(refusalsLogged), 99),
    };
    const checks = [
      target(`overload (${model}): refusals answered, p99`, result.refusalP99, 'ms', 'le', 5),
      target(`overload (${model}): admitted requests' time to first token p99 ÷ unloaded`, result.ttftLoadedP99 / result.ttftUnloadedP99, '×', 'le', 2),
      target(
        `overload (${model}): refusals the server counted ÷ those the clients saw`,
        result.refused === 0 ? 1 : result.shedCounted / result.refused,
        '×',
        'ge',
        1,
      ),
    ];
    return { result, checks };
  } finally {
    agent.destroy();
    child.kill('SIGTERM');
    await new Promise((resolve) => child.once('exit', resolve));
    await rm(models, { recursive: true, force: true });
  }
}

/** Runs `plan` on a load thread of its own. */
function runLoad(plan: LoadPlan): Promise<LoadReport> {
  return new Promise((resolve, reject) => {
    // tsx's hooks are not ready when a worker's entry loads (Node 20): the worker registers them first.
    const entry = new URL('./offer-load.ts', import.meta.url).href;
    const bootstrap = `import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then(({ register }) => { register(); return import(${JSON.stringify(entry)}); });`;
    const worker = new Worker(bootstrap, { eval: true, workerData: plan });
    worker.once('message', (report: LoadReport) => resolve(report));
    worker.once('error', reject);
  });
}

export function overloadReport(result: OverloadResult, checks: readonly TargetCheck[]): string {
  const rows = [
    ['capacity (closed loop)', `${result.capacity.toFixed(0)} requests/s`],
    ['offered', `${result.offered.toFixed(0)} requests/s for ${result.seconds} s`],
    ['admitted / refused / failed', `${result.admitted} / ${result.refused} / ${result.failed}`],
    ['refusal p99', `${result.refusalP99.toFixed(1)} ms`],
    ["load threads' own event-loop delay p99", `${result.loopDelayP99.toFixed(1)} ms`],
    ['refusal p99 inside the server (its request log)', `${result.refusalInServerP99.toFixed(2)} ms`],
    ['time to first token p99, unloaded / admitted under overload', `${result.ttftUnloadedP99.toFixed(1)} / ${result.ttftLoadedP99.toFixed(1)} ms`],
    ['server RSS before / after / peak', `${formatMB(result.rssBefore)} / ${formatMB(result.rssAfter)} / ${formatMB(result.rssPeak)}`],
    ['refusals counted by the server (intake sheds)', String(result.shedCounted)],
    ['server alive after', result.alive ? 'yes' : 'NO'],
  ];
  const judged = checks.map((c) => [c.what, c.measured.toFixed(2), `${c.comparison === 'ge' ? '≥' : '≤'} ${c.limit}`, c.pass ? 'PASS' : 'MISS']);
  return `${textTable(['', ''], rows)}\n${textTable(['target', 'measured', 'limit', ''], judged)}\nload average ${loadavg()[0]!.toFixed(1)}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const only = process.env.BENCH_OVERLOAD_MODEL;
  for (const model of Object.keys(OVERLOAD_IDS) as OverloadModel[]) {
    if (only !== undefined && only !== model) continue;
    const { result, checks } = await measureOverload(model, (m) => process.stderr.write(`${m}\n`));
    console.log(`${model}\n${overloadReport(result, checks)}`);
  }
}
