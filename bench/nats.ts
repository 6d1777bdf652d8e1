/**
 * Links over NATS (section 7 of `npm run bench`): what crossing a process over a `sluice/nats`
 * link costs, beside an in-process stage. The bench starts its own nats-server with JetStream on
 * 127.0.0.1 (marble-tests/support/nats-server.ts); without `nats-server` on the PATH the section
 * is skipped. Every scenario uses links of its own:
 *   - `nats-hop-1`, `nats-hop-16`, `nats-hop-256` (n = BENCH_NATS_N, default 5,000): a producer
 *     `toLink(fromIterable(n numbers))` and, at the same time, a receiver `fromLink(link, { maxBatch: b })`
 *     → `untraced()` → a counter, in this process; link capacity max(64, 2b), publishWindow b.
 *     Wall time from the start of both to the n-th element received, per element; beside it one
 *     in-process `stage(x => x)` (source → stage → `untraced()` → counter, median of 11 runs of n after
 *     ≥ 200,000 elements of warm-up);
 *   - `nats-workers-1`, `nats-workers-2` (n = BENCH_NATS_WORK_N, default 2,000): the same stage
 *     with 1 ms of async work per element (a timer, concurrency 1) in 1 and in 2 worker processes
 *     (bench/nats-worker.ts) sharing one link; each reports every element it finished on core
 *     NATS. Wall time from the producer's start to the n-th distinct element reported;
 *   - `nats-bounds` (n = BENCH_NATS_BOUNDS_N, default 1,000): a receiver slower than its producer
 *     (stage with 2 ms of async work, capacity 4, concurrency 1, maxBatch 16): the stream's message
 *     count read every 5 ms against the link's capacity, and the receiver's `held` (received, not
 *     yet settled; read every 5 ms and at each work call) against the stage's capacity + concurrency;
 *   - `nats-redelivery`: a worker process takes 4 messages into work that never ends (link ackWait
 *     2 s), a receiver here subscribes once it has, and the worker is killed (SIGKILL) 500 ms later:
 *     ms from the kill to the first and the last message the receiver gets (each a second delivery).
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { type NatsConnection, connect } from '@nats-io/transport-node';
import { type Observable, count, lastValueFrom, reduce, take, tap } from 'rxjs';
import { fromIterable, stage, untraced } from 'sluice';
import { type Link, LinkReceiverStats, fromLink, linkMessageOf, openLink, toLink } from 'sluice/nats';
import { startNatsServer } from '../marble-tests/support/nats-server.js';
import { envInt, median } from './harness.js';

export interface NatsConfig {
  readonly n: number;
  readonly workN: number;
  readonly boundsN: number;
}

export function natsConfig(): NatsConfig {
  return { n: envInt('BENCH_NATS_N', 5_000), workN: envInt('BENCH_NATS_WORK_N', 2_000), boundsN: envInt('BENCH_NATS_BOUNDS_N', 1_000) };
}

export const NATS_BATCHES = [1, 16, 256] as const;
export const NATS_WORKERS = [1, 2] as const;
/** Work per element in the worker scenarios (ms, a timer). */
export const NATS_WORK_MS = 1;
/** The slow receiver of `nats-bounds`: its stage's work (ms), capacity and concurrency, and its pulls. */
export const BOUNDS = { workMs: 2, capacity: 4, concurrency: 1, maxBatch: 16, linkCapacity: 64 } as const;
/** `nats-redelivery`: the link's ackWait, the messages the killed worker holds, and how long it holds them before the kill. */
export const REDELIVERY = { ackWait: 2_000, held: 4, killAfterMs: 500 } as const;

export function natsScenarioIds(): string[] {
  return [...NATS_BATCHES.map((b) => `nats-hop-${b}`), ...NATS_WORKERS.map((w) => `nats-workers-${w}`), 'nats-bounds', 'nats-redelivery'];
}

/** The server's version, or why the section cannot run here. */
export function natsServerVersion(): { version: string } | { missing: string } {
  const probe = spawnSync('nats-server', ['--version'], { encoding: 'utf8' });
  const code = (probe.error as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOENT') return { missing: 'nats-server is not on the PATH (Debian: apt-get install nats-server)' };
  if (probe.error !== undefined) return { missing: `nats-server could not be run: ${probe.error.message}` };
  return { version: probe.stdout.trim() };
}

export interface HopResult {
  readonly id: string;
  readonly batch: number;
  readonly n: number;
  readonly capacity: number;
  readonly publishWindow: number;
  readonly ms: number;
  readonly usPerElement: number;
  readonly perSecond: number;
  /** One in-process `stage(x => x)`, ns per element (the same figure on every row). */
  readonly inProcessNs: number;
}

export interface WorkersResult {
  readonly id: string;
  readonly workers: number;
  readonly n: number;
  readonly workMs: number;
  readonly ms: number;
  readonly perSecond: number;
}

export interface BoundsResult {
  readonly id: string;
  readonly n: number;
  readonly ms: number;
  readonly capacity: number;
  /** Peak of the stream's message count, sampled every 5 ms. */
  readonly peakBacklog: number;
  /** What the producer's own looks at the backlog saw (`PublishSummary.peakBacklog`). */
  readonly producerPeakBacklog: number;
  readonly backlogSamples: number;
  /** The receiver's stage capacity + concurrency: what its pipeline asks for at most. */
  readonly room: number;
  readonly peakHeld: number;
}

export interface RedeliveryResult {
  readonly id: string;
  readonly ackWait: number;
  readonly held: number;
  /** From the worker taking its last message to the kill. */
  readonly heldBeforeKillMs: number;
  readonly firstMs: number;
  readonly lastMs: number;
  /** Messages the receiver got with `deliveries > 1`. */
  readonly redelivered: number;
}

export interface NatsResults {
  readonly server: string;
  readonly hops: HopResult[];
  readonly workers: WorkersResult[];
  readonly bounds: BoundsResult | undefined;
  readonly redelivery: RedeliveryResult | undefined;
}

type Progress = (message: string) => void;

const WORKER = fileURLToPath(new URL('./nats-worker.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../', import.meta.url));
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

function* naturals(n: number): Generator<number> {
  for (let i = 0; i < n; i++) yield i;
}

let serial = 0;
/** A link name no earlier scenario used: each scenario starts on an empty stream and a consumer of its own. */
const freshName = (kind: string): string => `bench-${kind}-${++serial}`;

/** Rejects when `promise` has not settled within `ms`: a stalled scenario fails the section, it does not hang it. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done within ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Resolves with the sum of the first `n` values of `source`. */
function sumOf(source: Observable<number>, n: number): Promise<number> {
  return lastValueFrom(
    source.pipe(
      take(n),
      reduce((sum, value) => sum + value, 0),
    ),
  );
}

function checkSum(what: string, sum: number, n: number): void {
  const expected = (n * (n - 1)) / 2;
  if (sum !== expected) throw new Error(`${what}: the values received sum to ${sum}, expected ${expected} (lost or repeated elements)`);
}

// ---------------------------------------------------------------- one hop

/** Runs of n elements before the timed ones: enough for the JIT to settle, whatever n. */
const warmUpRounds = (n: number): number => Math.max(3, Math.ceil(200_000 / n));

/** ns per element of source → one `stage(x => x)` → `untraced()` → counter, in this process (median of 11 runs of n). */
async function inProcessHopNs(n: number): Promise<number> {
  const samples: number[] = [];
  const warmUps = warmUpRounds(n);
  for (let round = 0; round < warmUps + 11; round++) {
    const start = performance.now();
    const sum = await sumOf(
      fromIterable(naturals(n)).pipe(
        stage((x: number) => x),
        untraced(),
      ),
      n,
    );
    const ms = performance.now() - start;
    checkSum('in-process stage', sum, n);
    if (round >= warmUps) samples.push((ms * 1e6) / n);
  }
  return median(samples);
}

/** Producer and receiver over `link` at once; ms from their start to the n-th element received. */
async function hopRun(link: Link<number>, batch: number, n: number, producerId: string): Promise<number> {
  const start = performance.now();
  const receiving = sumOf(fromLink<number>(link, { maxBatch: batch }).pipe(untraced()), n).then((sum) => ({ sum, at: performance.now() }));
  const producing = toLink(fromIterable(naturals(n)), link, { producerId });
  const [{ sum, at }] = await within(Promise.all([receiving, producing]), 120_000, `link hop, batch ${batch}`);
  checkSum(`link hop, batch ${batch}`, sum, n);
  return at - start;
}

async function measureHop(connection: NatsConnection, batch: number, n: number, inProcessNs: number): Promise<HopResult> {
  const capacity = Math.max(64, 2 * batch);
  const options = { capacity, publishWindow: batch };
  // The warm-up (the client's code paths, the JIT) on a link of its own, so the timed run starts on a fresh consumer.
  const warm = await openLink<number>(connection, { name: freshName(`hop-${batch}-warm`), ...options });
  await hopRun(warm, batch, Math.min(n, 500), 'warm-up');
  const link = await openLink<number>(connection, { name: freshName(`hop-${batch}`), ...options });
  const ms = await hopRun(link, batch, n, 'timed');
  return {
    id: `nats-hop-${batch}`,
    batch,
    n,
    capacity,
    publishWindow: batch,
    ms,
    usPerElement: (ms * 1000) / n,
    perSecond: (n * 1000) / ms,
    inProcessNs,
  };
}

// ---------------------------------------------------------------- worker processes

interface WorkerOptions {
  readonly capacity: number;
  readonly ackWait?: number;
  readonly workMs: number;
  readonly concurrency: number;
}

/** Starts bench/nats-worker.ts on `link`; resolves once it printed "ready". */
function startWorker(url: string, link: string, report: string, options: WorkerOptions): Promise<ChildProcess> {
  const args = [
    '--conditions=sluice-source',
    '--import',
    'tsx',
    WORKER,
    url,
    link,
    report,
    `--capacity=${options.capacity}`,
    `--work-ms=${options.workMs}`,
    `--concurrency=${options.concurrency}`,
    ...(options.ackWait === undefined ? [] : [`--ack-wait=${options.ackWait}`]),
  ];
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
  let errors = '';
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => void (errors += chunk));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`nats-worker did not get ready within 30 s:\n${errors}`));
    }, 30_000);
    const exited = (code: number | null) => {
      clearTimeout(timer);
      reject(new Error(`nats-worker exited with ${code} before it was ready:\n${errors}`));
    };
    child.once('exit', exited);
    let seen = '';
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
      seen += chunk;
      if (!seen.includes('ready\n')) return;
      clearTimeout(timer);
      child.off('exit', exited);
      child.stdout!.removeAllListeners('data').resume();
      resolve(child);
    });
  });
}

/** SIGTERM, then SIGKILL if it has not exited within 3 s. */
async function stopWorker(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3_000);
  await exited;
  clearTimeout(timer);
}

/** Resolves once `n` distinct values were published on `subject` (core NATS), with the time of the last. */
async function collectReports(connection: NatsConnection, subject: string, n: number): Promise<{ done: Promise<number>; stop: () => void }> {
  const seen = new Set<number>();
  let finish: (at: number) => void = () => {};
  const done = new Promise<number>((resolve) => (finish = resolve));
  const subscription = connection.subscribe(subject, {
    callback: (_error, message) => {
      seen.add(Number(message.string()));
      if (seen.size === n) finish(performance.now());
    },
  });
  await connection.flush(); // the server knows the subscription before a worker reports
  return { done, stop: () => subscription.unsubscribe() };
}

async function measureWorkers(url: string, connection: NatsConnection, workers: number, n: number): Promise<WorkersResult> {
  const name = freshName(`workers-${workers}`);
  const report = `bench.nats.${name}`;
  const capacity = 64;
  const link = await openLink<number>(connection, { name, capacity });
  const reports = await collectReports(connection, `${report}.done`, n);
  const children: ChildProcess[] = [];
  try {
    const starting = Array.from({ length: workers }, () => startWorker(url, name, report, { capacity, workMs: NATS_WORK_MS, concurrency: 1 }));
    for (const child of await Promise.all(starting)) children.push(child);
    await sleep(100); // each worker's first pull follows a lookup of the consumer after "ready"
    const start = performance.now();
    const producing = toLink(fromIterable(naturals(n)), link, { producerId: name });
    const [last] = await within(Promise.all([reports.done, producing]), 120_000, `${workers} worker(s)`);
    const ms = last - start;
    return { id: `nats-workers-${workers}`, workers, n, workMs: NATS_WORK_MS, ms, perSecond: (n * 1000) / ms };
  } finally {
    reports.stop();
    await Promise.all(children.map(stopWorker));
  }
}

// ---------------------------------------------------------------- bounds

async function measureBounds(connection: NatsConnection, n: number): Promise<BoundsResult> {
  const link = await openLink<number>(connection, { name: freshName('bounds'), capacity: BOUNDS.linkCapacity, publishWindow: BOUNDS.maxBatch });
  const stats = new LinkReceiverStats();
  let peakHeld = 0;
  let peakBacklog = 0;
  let backlogSamples = 0;
  let looking = false;
  const sample = (): void => {
    peakHeld = Math.max(peakHeld, stats.held);
    if (looking) return; // one look at the server at a time
    looking = true;
    link.jsm.streams.info(link.stream).then(
      (info) => {
        looking = false;
        backlogSamples++;
        peakBacklog = Math.max(peakBacklog, info.state.messages);
      },
      () => void (looking = false),
    );
  };
  const work = async (value: number): Promise<number> => {
    peakHeld = Math.max(peakHeld, stats.held);
    await sleep(BOUNDS.workMs);
    return value;
  };
  const timer = setInterval(sample, 5);
  const start = performance.now();
  try {
    const receiving = sumOf(
      fromLink<number>(link, { maxBatch: BOUNDS.maxBatch, stats }).pipe(
        stage(work, { capacity: BOUNDS.capacity, concurrency: BOUNDS.concurrency }),
        untraced(),
      ),
      n,
    ).then((sum) => ({ sum, at: performance.now() }));
    const producing = toLink(fromIterable(naturals(n)), link, { producerId: 'bounds' });
    const [{ sum, at }, summary] = await within(Promise.all([receiving, producing]), 120_000, 'slow receiver');
    const ms = at - start;
    checkSum('slow receiver', sum, n);
    return {
      id: 'nats-bounds',
      n,
      ms,
      capacity: BOUNDS.linkCapacity,
      peakBacklog,
      producerPeakBacklog: summary.peakBacklog,
      backlogSamples,
      room: BOUNDS.capacity + BOUNDS.concurrency,
      peakHeld,
    };
  } finally {
    clearInterval(timer);
  }
}

// ---------------------------------------------------------------- redelivery

async function measureRedelivery(url: string, connection: NatsConnection): Promise<RedeliveryResult> {
  const { ackWait, held, killAfterMs } = REDELIVERY;
  const name = freshName('redelivery');
  const report = `bench.nats.${name}`;
  const capacity = 64;
  const link = await openLink<number>(connection, { name, capacity, ackWait });
  const took = await collectReports(connection, `${report}.took`, held);
  const worker = await startWorker(url, name, report, { capacity, ackWait, workMs: 3_600_000, concurrency: held });
  try {
    await toLink(fromIterable(naturals(held)), link, { producerId: name });
    const tookAt = await within(took.done, 30_000, 'the worker taking its messages');
    // Subscribed now, this receiver can only get what the worker held, once the server gives it up.
    const arrivals: { at: number; deliveries: number }[] = [];
    const receiving = lastValueFrom(
      fromLink<number>(link, { maxBatch: held }).pipe(
        tap((element) => arrivals.push({ at: performance.now(), deliveries: linkMessageOf(element)?.deliveries ?? 0 })),
        untraced(),
        take(held),
        count(),
      ),
    );
    receiving.catch(() => {}); // awaited after the kill: a failure meanwhile must not be an unhandled rejection
    await sleep(Math.max(0, killAfterMs - (performance.now() - tookAt)));
    const killedAt = performance.now();
    worker.kill('SIGKILL');
    await within(receiving, ackWait * 5, 'redelivery after SIGKILL');
    return {
      id: 'nats-redelivery',
      ackWait,
      held,
      heldBeforeKillMs: killedAt - tookAt,
      firstMs: arrivals[0]!.at - killedAt,
      lastMs: arrivals[arrivals.length - 1]!.at - killedAt,
      redelivered: arrivals.filter((a) => a.deliveries > 1).length,
    };
  } finally {
    took.stop();
    await stopWorker(worker);
  }
}

// ---------------------------------------------------------------- the section

/** Runs the selected scenarios (`ids`) against a nats-server of its own, stopped at the end. */
export async function measureNats(ids: readonly string[], config: NatsConfig, server: string, progress: Progress): Promise<NatsResults> {
  const nats = await startNatsServer();
  const connection = await connect({ servers: nats.url });
  const hops: HopResult[] = [];
  const workers: WorkersResult[] = [];
  let bounds: BoundsResult | undefined;
  let redelivery: RedeliveryResult | undefined;
  try {
    const batches = NATS_BATCHES.filter((b) => ids.includes(`nats-hop-${b}`));
    if (batches.length > 0) {
      const inProcessNs = await inProcessHopNs(config.n);
      progress(`in-process stage(x => x): ${inProcessNs.toFixed(0)} ns/element`);
      for (const batch of batches) {
        const hop = await measureHop(connection, batch, config.n, inProcessNs);
        progress(`${hop.id}: ${hop.usPerElement.toFixed(1)} µs/element, ${hop.perSecond.toFixed(0)} messages/s`);
        hops.push(hop);
      }
    }
    for (const processes of NATS_WORKERS.filter((w) => ids.includes(`nats-workers-${w}`))) {
      const result = await measureWorkers(nats.url, connection, processes, config.workN);
      progress(`${result.id}: ${result.perSecond.toFixed(0)} elements/s`);
      workers.push(result);
    }
    if (ids.includes('nats-bounds')) {
      bounds = await measureBounds(connection, config.boundsN);
      progress(`nats-bounds: peak backlog ${bounds.peakBacklog} of ${bounds.capacity}, peak held ${bounds.peakHeld} of ${bounds.room}`);
    }
    if (ids.includes('nats-redelivery')) {
      redelivery = await measureRedelivery(nats.url, connection);
      progress(`nats-redelivery: first redelivered message ${redelivery.firstMs.toFixed(0)} ms after SIGKILL (ackWait ${redelivery.ackWait} ms)`);
    }
    return { server, hops, workers, bounds, redelivery };
  } finally {
    await connection.close();
    await nats.close();
  }
}
