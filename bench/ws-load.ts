/**
 * WebSocket load: 1,000 concurrent clients on loopback streaming 1M tokens in total,
 * from sluice's `attachTokenSocket` and from a naive `ws.send` loop, each server in its
 * own process (`ws-load-server.ts`) so that its RSS is its own and the clients, all in
 * this process, do not share its event loop.
 *
 *     node --conditions=sluice-source --import tsx bench/ws-load.ts              # about 1.5–2.5 min
 *     BENCH_WS_QUICK=1 node --conditions=sluice-source --import tsx bench/ws-load.ts   # smoke check, about 15 s
 *
 * Scenarios, for each server (a fresh server process each, every client connected and
 * warmed up with two 32-token requests first):
 * - `all-read`: every client reads its share of the tokens (1,000) in 5 rounds; in a
 *   round it sends 2 requests one after the other (the next when `done` arrives). p99 is
 *   reported per round and as their median, which the target uses: a burst of load from
 *   elsewhere on the machine moves one round, not the median. p50, p99.9 and max are
 *   over all the tokens.
 * - `stalled`: every 10th client sends one `generate` for a generation longer than the
 *   run (`BENCH_WS_STALLED_TOKENS`) and never reads again (its TCP socket is paused).
 *   They are served alone until every one of them has bytes queued in the server, i.e.
 *   the kernel takes no more for them — on loopback that is ~3.7 MB, ~54k tokens, per
 *   socket, so this fill takes 20–40 s — and the other 90% then do what they did in
 *   `all-read`. Without the fill, the kernel's socket buffers would absorb everything
 *   either server sends to a non-reader during the run and both would look the same:
 *   what is measured is a server with clients that have been stuck for a while.
 *
 * A token's text is the time the server generated it on the system-wide monotonic
 * clock, so its latency is "generated → handed to the client's `message` listener":
 * time queued in the server, in the kernel and in the client. Time to first token
 * (`generate` sent → first token) adds the wait for the server's event loop. Both
 * servers serve the same synthetic model, as fast as it is asked, so the bench measures
 * serving, not a model: sluice generates a token only when the socket can take it, the
 * naive server as fast as its loop turns.
 *
 * Server memory: peak RSS (`VmHWM`), the peak of the bytes queued in the server for all
 * sockets (`bufferedAmount`, sampled every 20 ms), and how much that queue grew while
 * the readers ran. Figures are measured on every run and reported beside their targets,
 * never asserted: the readers' p99 with non-readers ≤ 1.2× their p99 without, and memory
 * bounded: bytes queued with non-readers ≤ `highWaterMark` (64 KiB) plus one frame per
 * non-reader, plus what `all-read` queued — a bound that does not depend on how long
 * they stay or how much they asked for. RSS is reported beside it; it also moves with
 * the heap V8 keeps for garbage. With `BENCH_WS_SERVER_FLAGS=--expose-gc` the server
 * also reports its live heap (a forced GC every 500 ms: a diagnostic, it disturbs the
 * latency figures).
 *
 * sluice's limits are raised for the bench: the per-tenant quotas (every client is in
 * one tenant) to the number of clients, `maxTokens` to the non-readers' request, and
 * `stallTimeout` and the heartbeat to 180 s, so that the non-readers stay connected,
 * with what the server queued for them, for the whole run. The production default
 * (10 s) would close them with 4008 during the fill and flatter the memory figures;
 * any close is reported.
 *
 * Environment (all optional):
 *   BENCH_WS_CLIENTS=1000          concurrent WebSocket clients
 *   BENCH_WS_TOKENS=1000000        tokens over all clients in `all-read` (each client gets its share)
 *   BENCH_WS_ROUNDS=5              rounds each reader's share is split into (all readers start a round together)
 *   BENCH_WS_REQUESTS=2            sequential requests per reader and round
 *   BENCH_WS_STALLED_PERCENT=10    share of the clients that never read, in `stalled`
 *   BENCH_WS_STALLED_TOKENS=100000 max_tokens of each non-reader's request
 *   BENCH_WS_FILL_MS=60000         longest the non-readers are served alone before the readers start anyway
 *   BENCH_WS_STALL_MS=180000       sluice's stallTimeout (and heartbeat) for the run
 *   BENCH_WS_YIELD_EVERY=32        naive server: tokens sent between two setImmediate yields
 *   BENCH_WS_DEADLINE_MS=90000     a phase still running after this is cut short and reported partial
 *   BENCH_WS_QUICK=1               smaller defaults (100 clients, 100k tokens)
 *   BENCH_WS_SERVER_FLAGS='...'    extra node flags for the server processes (e.g. `--cpu-prof --cpu-prof-dir=/tmp/prof`)
 *   BENCH_WS_DIST=1                the servers load sluice from dist/ (`npm run build` first), as users run it, instead of
 *                                  its source through tsx (whose esbuild keepNames adds a `name` property to every closure)
 *   BENCH_ONLY=regex               run only the scenarios whose id matches (`ws-sluice-all-read`, `ws-naive-stalled`...)
 */
import { fork, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { WebSocket } from 'ws';
import {
  envInt,
  formatCount,
  formatMB,
  formatRatio,
  markdownTable,
  median,
  monotonicMs,
  percentile,
  selected,
  target,
  textTable,
  type TargetCheck,
} from './harness.js';
import type { ServerKind, ServerReport } from './ws-load-server.js';

export interface WsLoadConfig {
  readonly clients: number;
  readonly tokens: number;
  readonly rounds: number;
  readonly requests: number;
  readonly stalledPercent: number;
  readonly stalledTokens: number;
  readonly stallTimeout: number;
  readonly yieldEvery: number;
  readonly deadline: number;
  readonly fillTimeout: number;
}

export function wsLoadConfig(): WsLoadConfig {
  const quick = (process.env.BENCH_WS_QUICK ?? '') !== '' && process.env.BENCH_WS_QUICK !== '0';
  const config = {
    clients: envInt('BENCH_WS_CLIENTS', quick ? 100 : 1_000),
    tokens: envInt('BENCH_WS_TOKENS', quick ? 100_000 : 1_000_000),
    rounds: envInt('BENCH_WS_ROUNDS', 5),
    requests: envInt('BENCH_WS_REQUESTS', 2),
    stalledPercent: envInt('BENCH_WS_STALLED_PERCENT', 10),
    stalledTokens: envInt('BENCH_WS_STALLED_TOKENS', 100_000),
    stallTimeout: envInt('BENCH_WS_STALL_MS', 180_000),
    yieldEvery: envInt('BENCH_WS_YIELD_EVERY', 32),
    deadline: envInt('BENCH_WS_DEADLINE_MS', 90_000),
    fillTimeout: envInt('BENCH_WS_FILL_MS', 60_000),
  };
  if (config.stalledPercent >= 100) throw new Error('BENCH_WS_STALLED_PERCENT must be below 100');
  if (config.tokens < config.clients * config.rounds * config.requests)
    throw new Error('BENCH_WS_TOKENS must give every request of every client at least one token');
  return config;
}

/** The limit sluice keeps a socket's `bufferedAmount` under (its default `highWaterMark`): what it may hold per non-reader. */
const SLUICE_HIGH_WATER_MARK = 64 * 1024;
const TARGET_P99_RATIO = 1.2;
const BEARER = 'bench-token';
/** Clients connecting at once (the rest wait): a burst of 1,000 SYNs on loopback is not what is measured. */
const CONNECT_BATCH = 100;
const FILL_POLL_MS = 250;
/** Each client's warm-up: two short requests, not measured. */
const WARM_UP_PLAN = [32, 32];

export interface WsScenario {
  readonly id: string;
  readonly server: ServerKind;
  /** Whether 10% of the clients never read. */
  readonly stalled: boolean;
}

export function wsScenarios(): WsScenario[] {
  return [
    { id: 'ws-sluice-all-read', server: 'sluice', stalled: false },
    { id: 'ws-naive-all-read', server: 'naive', stalled: false },
    { id: 'ws-sluice-stalled', server: 'sluice', stalled: true },
    { id: 'ws-naive-stalled', server: 'naive', stalled: true },
  ];
}

export interface WsLoadResult {
  readonly id: string;
  readonly server: ServerKind;
  readonly stalled: boolean;
  readonly readers: number;
  readonly nonReaders: number;
  /** Tokens the readers were to receive, and did. */
  readonly expectedTokens: number;
  readonly receivedTokens: number;
  /** From the readers' first `generate` to the last reader's last `done`, summed over the rounds. */
  readonly seconds: number;
  readonly tokensPerSecond: number;
  /** Token latency of the readers, ms: generated by the server → received by the client, over all rounds' tokens. */
  readonly p50: number;
  readonly p90: number;
  readonly p99: number;
  /** The p99 of each round, and their median: one burst of load from elsewhere on the machine moves one round, not the median. */
  readonly roundP99: readonly number[];
  readonly p99Median: number;
  readonly p999: number;
  readonly max: number;
  /** Time to first token of the readers' requests, ms: `generate` sent → first token received (includes any wait for the server's event loop). */
  readonly firstTokenP50: number;
  readonly firstTokenP99: number;
  /** The slowest reader's time to receive all its tokens in a round, s. */
  readonly slowestReader: number;
  readonly errors: Readonly<Record<string, number>>;
  /** Readers the server closed before they were done (close code → count). */
  readonly readerCloses: Readonly<Record<string, number>>;
  readonly partial: boolean;
  readonly clientCpuSeconds: number;
  readonly serverCpuSeconds: number;
  /** The 1-minute load average when the readers started: other work on the machine moves every latency figure. */
  readonly loadAverage: number;
  /** What the server process measured on itself, at the end. */
  readonly report: ServerReport;
  /** The non-readers served alone before the readers started, until the kernel held no more for them (their socket had `stuck` bytes queued in the server). */
  readonly fill: { readonly seconds: number; readonly stuck: number; readonly tokens: number; readonly queued: number } | undefined;
  /** Tokens the server generated for the non-readers while the readers ran: the CPU it spent on clients that do not read. */
  readonly nonReaderTokensWhileReading: number;
  /** Bytes queued in the server (all sockets' `bufferedAmount`) when the readers started and when they were done. */
  readonly queuedAtStart: number;
  readonly queuedAtEnd: number;
}

type Progress = (message: string) => void;

/** True when the servers load sluice from dist/ (`BENCH_WS_DIST=1`; `npm run build` first). */
export function dist(): boolean {
  return (process.env.BENCH_WS_DIST ?? '') !== '' && process.env.BENCH_WS_DIST !== '0';
}

export function startServer(kind: ServerKind, config: WsLoadConfig): Promise<{ child: ChildProcess; port: number }> {
  const entry = fileURLToPath(new URL('./ws-load-server.ts', import.meta.url));
  const watchdog = join(mkdtempSync(join(tmpdir(), 'sluice-ws-load-')), 'watchdog.json');
  const child = fork(entry, [kind], {
    // BENCH_WS_DIST=1: sluice from dist/ (esbuild, as users run it), not from source through tsx, whose keepNames gives every closure a `name` property.
    execArgv: [
      ...(dist() ? [] : ['--conditions=sluice-source']),
      '--import',
      'tsx',
      ...(process.env.BENCH_WS_SERVER_FLAGS ?? '').split(' ').filter((flag) => flag !== ''),
    ],
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: {
      ...process.env,
      WS_LOAD_TOKEN: BEARER,
      WS_LOAD_WATCHDOG_FILE: watchdog,
      WS_LOAD_CLIENTS: String(config.clients),
      WS_LOAD_STALL_TIMEOUT: String(config.stallTimeout),
      WS_LOAD_MAX_TOKENS: String(Math.max(config.stalledTokens, Math.ceil(config.tokens / config.clients))),
      WS_LOAD_YIELD_EVERY: String(config.yieldEvery),
    },
  });
  watchdogFiles.set(child, watchdog);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill();
      reject(new Error(`the ${kind} server did not start within 30 s`));
    }, 30_000);
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`the ${kind} server exited with ${code} before listening`));
    });
    child.once('message', (message: { type: string; port: number }) => {
      clearTimeout(timer);
      child.removeAllListeners('exit');
      if (message.type === 'ready') resolve({ child, port: message.port });
      else reject(new Error(`unexpected message from the ${kind} server: ${JSON.stringify(message)}`));
    });
  });
}

/** What a server's watchdog thread last wrote (see `ws-load-server.ts`): readable while its event loop is held. */
export interface WatchdogState {
  readonly tokensGenerated: number;
  /** How long, ms, since the server's event loop last turned. */
  readonly heldMs: number;
  readonly rss: number;
  readonly peakRss: number;
}

/** The server did not answer a report within `REPORT_TIMEOUT`; `state` is what its watchdog thread saw. */
export class ServerUnresponsive extends Error {
  constructor(readonly state: WatchdogState | undefined) {
    super(
      state === undefined
        ? `the server did not report within ${REPORT_TIMEOUT / 1000} s`
        : `the server did not report within ${REPORT_TIMEOUT / 1000} s: its event loop has not turned for ${(state.heldMs / 1000).toFixed(1)} s (${state.tokensGenerated} tokens made, RSS ${formatMB(state.rss)})`,
    );
  }
}

/** Long: a server whose event loop generating for non-readers holds (the AI SDK's) answers late, and that is a figure, not a failure. */
const REPORT_TIMEOUT = 60_000;
const watchdogFiles = new WeakMap<ChildProcess, string>();

/** The server's watchdog state, if it wrote one. */
export function watchdogState(child: ChildProcess): WatchdogState | undefined {
  const file = watchdogFiles.get(child);
  try {
    return file === undefined ? undefined : (JSON.parse(readFileSync(file, 'utf8')) as WatchdogState);
  } catch {
    return undefined;
  }
}

export function serverReport(child: ChildProcess, restart = false): Promise<ServerReport> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new ServerUnresponsive(watchdogState(child))), REPORT_TIMEOUT);
    child.once('message', (message: { type: string; report: ServerReport }) => {
      clearTimeout(timer);
      resolve(message.report);
    });
    child.send({ type: 'report', restart });
  });
}

export async function stopServer(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.send({ type: 'exit' });
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(timer);
}

function connect(port: number): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/`, ['sluice.v1', `bearer.${BEARER}`], { perMessageDeflate: false });
    ws.once('open', () => {
      ws.off('error', reject);
      // A reset shows as a 'close' (counted by the phase that was running); the 'error' before it must not throw.
      ws.on('error', () => {});
      resolve(ws);
    });
    ws.once('error', reject);
  });
}

async function connectAll(port: number, count: number): Promise<WebSocket[]> {
  const sockets: WebSocket[] = [];
  for (let i = 0; i < count; i += CONNECT_BATCH) {
    const batch = await Promise.all(Array.from({ length: Math.min(CONNECT_BATCH, count - i) }, () => connect(port)));
    sockets.push(...batch);
  }
  return sockets;
}

interface Frame {
  readonly type: 'hello' | 'token' | 'done' | 'error';
  readonly text?: string;
  readonly code?: string;
}

interface PhaseOutcome {
  readonly received: number;
  /** Time to first token of every request, ms: `generate` sent → first token received. */
  readonly firstTokens: Float64Array;
  readonly errors: Readonly<Record<string, number>>;
  /** Readers the server closed before they were done (close code → count). */
  readonly closes: Readonly<Record<string, number>>;
  readonly seconds: number;
  /** The slowest reader's time to its last `done`, s. */
  readonly slowest: number;
  readonly partial: boolean;
}

/**
 * Every socket runs `plan.length` requests one after the other (`plan[r]` tokens each,
 * the next one sent when `done` arrives) until all are done or `deadline` ms passed.
 * Token latencies go to `latencies` when given.
 */
async function readPhase(
  sockets: readonly WebSocket[],
  plan: readonly number[],
  options: { readonly deadline: number; readonly latencies?: Float64Array; readonly onTick?: (received: number, finished: number) => void },
): Promise<PhaseOutcome> {
  const latencies = options.latencies;
  let received = 0;
  let finished = 0;
  let slowest = 0;
  const firstTokens = new Float64Array(sockets.length * plan.length);
  let firstTokenCount = 0;
  const errors: Record<string, number> = {};
  const closes: Record<string, number> = {};
  const started = monotonicMs();
  let allDone!: () => void;
  const done = new Promise<'done'>((resolve) => (allDone = () => resolve('done')));
  const finish = () => {
    slowest = Math.max(slowest, monotonicMs() - started);
    if (++finished === sockets.length) allDone();
  };
  const listeners = sockets.map((ws) => {
    let current = 0;
    let over = false;
    let sentAt = 0;
    const request = (r: number) => {
      sentAt = monotonicMs();
      ws.send(JSON.stringify({ type: 'generate', id: `r${r}`, prompt: 'load', parameters: { max_tokens: plan[r] } }));
    };
    const onMessage = (data: Buffer) => {
      const now = monotonicMs();
      const frame = JSON.parse(data.toString('utf8')) as Frame;
      if (frame.type === 'hello') return; // sluice greets each connection; the naive server does not
      if (frame.type === 'token') {
        if (latencies !== undefined && received < latencies.length) latencies[received] = now - Number(frame.text);
        received++;
        if (sentAt !== 0) {
          firstTokens[firstTokenCount++] = now - sentAt;
          sentAt = 0;
        }
        return;
      }
      if (frame.type === 'error') errors[frame.code ?? 'unknown'] = (errors[frame.code ?? 'unknown'] ?? 0) + 1;
      if (++current < plan.length) request(current);
      else if (!over) {
        over = true;
        finish();
      }
    };
    const onClose = (code: number) => {
      if (over) return;
      over = true;
      closes[code] = (closes[code] ?? 0) + 1;
      finish();
    };
    ws.on('message', onMessage);
    ws.on('close', onClose);
    return { ws, onMessage, onClose, request };
  });
  for (const { request } of listeners) request(0);

  const ticker = options.onTick === undefined ? undefined : setInterval(() => options.onTick!(received, finished), 5_000);
  const cutShort = new AbortController();
  const deadline = sleep(options.deadline, 'deadline' as const, { signal: cutShort.signal }).catch(() => 'deadline' as const);
  const outcome = sockets.length === 0 ? 'done' : await Promise.race([done, deadline]);
  cutShort.abort();
  clearInterval(ticker);
  const seconds = (monotonicMs() - started) / 1000;
  for (const { ws, onMessage, onClose } of listeners) {
    ws.off('message', onMessage);
    ws.off('close', onClose);
  }
  return {
    received,
    firstTokens: firstTokens.subarray(0, firstTokenCount).sort(),
    errors,
    closes,
    seconds,
    slowest: outcome === 'done' ? slowest / 1000 : seconds,
    partial: outcome !== 'done',
  };
}

/** Splits `total` tokens into `parts` requests (the first ones take the remainder). */
export function split(total: number, parts: number): number[] {
  return Array.from({ length: parts }, (_, r) => Math.floor(total / parts) + (r < total % parts ? 1 : 0));
}

export async function measureWsScenario(scenario: WsScenario, config: WsLoadConfig, onProgress: Progress = () => {}): Promise<WsLoadResult> {
  const nonReaders = scenario.stalled ? Math.round((config.clients * config.stalledPercent) / 100) : 0;
  const perClient = Math.floor(config.tokens / config.clients);

  const { child, port } = await startServer(scenario.server, config);
  let sockets: WebSocket[] = [];
  try {
    sockets = await connectAll(port, config.clients);
    // Every client (non-readers too, before they stop reading) runs a short generation first, so both processes are warm.
    const warm = await readPhase(sockets, WARM_UP_PLAN, { deadline: config.deadline });
    onProgress(`${scenario.id}: ${sockets.length} clients connected, ${formatCount(warm.received)} warm-up tokens in ${warm.seconds.toFixed(1)} s`);

    // The non-readers are spread evenly over the connection order (every 10th client by default).
    const stride = nonReaders === 0 ? Infinity : config.clients / nonReaders;
    const isNonReader = (i: number) => nonReaders > 0 && i % stride < 1 && Math.floor(i / stride) < nonReaders;
    const stuck = sockets.filter((_, i) => isNonReader(i));
    const reading = sockets.filter((_, i) => !isNonReader(i));
    const expectedTokens = reading.length * perClient;

    // The non-readers are served alone until the kernel takes no more for them: clients stuck for a while, not ones that just stopped.
    const beforeFill = await serverReport(child);
    for (const ws of stuck) {
      ws.send(JSON.stringify({ type: 'generate', id: 'stuck', prompt: 'never read', parameters: { max_tokens: config.stalledTokens } }));
      ws.pause(); // `ws`'s own pause: pausing its TCP socket directly, `ws` resumes it when its frame parser drains
    }
    const filling = monotonicMs();
    let fill = stuck.length === 0 ? undefined : beforeFill;
    const requested = beforeFill.tokensGenerated + stuck.length * config.stalledTokens;
    while (fill !== undefined && fill.stuck < stuck.length && fill.tokensGenerated < requested && monotonicMs() - filling < config.fillTimeout) {
      await sleep(FILL_POLL_MS);
      fill = await serverReport(child);
    }
    const fillSeconds = (monotonicMs() - filling) / 1000;
    const fillTokens = fill === undefined ? 0 : fill.tokensGenerated - beforeFill.tokensGenerated;
    if (fill !== undefined) {
      onProgress(
        `${scenario.id}: ${fill.stuck} / ${stuck.length} non-readers stuck after ${fillSeconds.toFixed(1)} s (${formatCount(fillTokens)} tokens sent to them, ${formatMB(fill.buffered)} queued in the server)`,
      );
    }

    const loadAverage = loadavg()[0]!;
    const clientCpu = process.cpuUsage();
    // Also restarts the server's event-loop delay histogram, so it covers the measured window only.
    const atStart = await serverReport(child, true);
    const latencies = new Float64Array(expectedTokens);
    const rounds: PhaseOutcome[] = [];
    const roundP99: number[] = [];
    let received = 0;
    for (const [round, roundTokens] of split(perClient, config.rounds).entries()) {
      const own = latencies.subarray(received, received + roundTokens * reading.length);
      const phase = await readPhase(reading, split(roundTokens, config.requests), {
        deadline: config.deadline,
        latencies: own,
        onTick: (got, finished) =>
          onProgress(
            `${scenario.id}: round ${round + 1}: ${formatCount(got)} / ${formatCount(own.length)} tokens, ${finished} / ${reading.length} readers done`,
          ),
      });
      roundP99.push(percentile(own.subarray(0, Math.min(phase.received, own.length)).sort(), 99));
      received += phase.received;
      rounds.push(phase);
      if (phase.partial) break;
    }
    const cpu = process.cpuUsage(clientCpu);
    const report = await serverReport(child);
    const seconds = rounds.reduce((sum, r) => sum + r.seconds, 0);
    const firstTokens = Float64Array.from(rounds.flatMap((r) => [...r.firstTokens])).sort();
    const sum = (records: readonly Readonly<Record<string, number>>[]) => {
      const total: Record<string, number> = {};
      for (const record of records) for (const [key, n] of Object.entries(record)) total[key] = (total[key] ?? 0) + n;
      return total;
    };

    const sorted = latencies.subarray(0, Math.min(received, latencies.length)).sort();
    return {
      id: scenario.id,
      server: scenario.server,
      report,
      fill: fill === undefined ? undefined : { seconds: fillSeconds, stuck: fill.stuck, tokens: fillTokens, queued: fill.buffered },
      // Every reader finished, so every token generated for a reader was received.
      nonReaderTokensWhileReading: Math.max(0, report.tokensGenerated - atStart.tokensGenerated - received),
      queuedAtStart: atStart.buffered,
      queuedAtEnd: report.buffered,
      stalled: scenario.stalled,
      readers: reading.length,
      nonReaders: stuck.length,
      expectedTokens,
      receivedTokens: received,
      seconds,
      tokensPerSecond: received / seconds,
      p50: percentile(sorted, 50),
      p90: percentile(sorted, 90),
      p99: percentile(sorted, 99),
      roundP99,
      p99Median: median(roundP99),
      p999: percentile(sorted, 99.9),
      max: sorted.length === 0 ? NaN : sorted[sorted.length - 1]!,
      firstTokenP50: percentile(firstTokens, 50),
      firstTokenP99: percentile(firstTokens, 99),
      slowestReader: Math.max(...rounds.map((r) => r.slowest)),
      errors: sum([warm.errors, ...rounds.map((r) => r.errors)]),
      readerCloses: sum(rounds.map((r) => r.closes)),
      partial: warm.partial || rounds.some((r) => r.partial),
      clientCpuSeconds: (cpu.user + cpu.system) / 1e6,
      serverCpuSeconds: report.cpuSeconds - atStart.cpuSeconds,
      loadAverage,
    };
  } finally {
    for (const ws of sockets) ws.terminate();
    await stopServer(child);
  }
}

/** Runs the selected scenarios one after the other, each against a fresh server process. */
export async function measureWsLoad(scenarios: readonly WsScenario[], config: WsLoadConfig, onProgress: Progress = () => {}): Promise<WsLoadResult[]> {
  const results: WsLoadResult[] = [];
  for (const scenario of scenarios) {
    const result = await measureWsScenario(scenario, config, onProgress);
    onProgress(
      `${scenario.id}: ${formatCount(result.receivedTokens)} tokens in ${result.seconds.toFixed(2)} s, p50 ${ms(result.p50)} ms, p99 ${ms(result.p99Median)} ms (rounds ${result.roundP99.map(ms).join(', ')}), server peak RSS ${formatMB(result.report.peakRss)}${result.partial ? ' (PARTIAL: deadline)' : ''}`,
    );
    results.push(result);
  }
  return results;
}

const ms = (value: number) => (!Number.isFinite(value) ? '—' : value >= 100 ? value.toFixed(0) : value >= 1 ? value.toFixed(1) : value.toFixed(2));
const counts = (record: Readonly<Record<string, number>>) =>
  Object.entries(record)
    .map(([key, n]) => `${n}× ${key}`)
    .join(', ');

/** Tables and target checks for a set of results (any subset of the scenarios). */
export function wsLoadReport(results: readonly WsLoadResult[]): {
  header: string[];
  rows: string[][];
  comparisonHeader: string[];
  comparisonRows: string[][];
  checks: TargetCheck[];
  notes: string[];
} {
  const label = (server: ServerKind) => (server === 'sluice' ? 'sluice `attachTokenSocket`' : 'naive `ws.send` loop');
  const header = [
    'server',
    'clients',
    'tokens to readers',
    's',
    'tokens/s',
    'p50 ms',
    'p99 ms (rounds)',
    'p99.9 ms',
    'max ms',
    'first token p50 / p99 ms',
    'server peak RSS',
    'queued in server: peak (growth while readers ran)',
    'tokens made for non-readers while readers ran',
    'cpu: server / client',
  ];
  const rows = results.map((r) => [
    `${label(r.server)}${r.partial ? ' (partial)' : ''}`,
    r.nonReaders === 0 ? `${r.readers} reading` : `${r.readers} reading + ${r.nonReaders} not`,
    formatCount(r.receivedTokens),
    r.seconds.toFixed(1),
    formatCount(Math.round(r.tokensPerSecond / 1000) * 1000),
    ms(r.p50),
    `${ms(r.p99Median)}${r.roundP99.length > 1 ? ` (${r.roundP99.map(ms).join(', ')})` : ''}`,
    ms(r.p999),
    ms(r.max),
    `${ms(r.firstTokenP50)} / ${ms(r.firstTokenP99)}`,
    formatMB(r.report.peakRss),
    `${formatMB(r.report.peakBuffered)} (${r.queuedAtEnd >= r.queuedAtStart ? '+' : '−'}${formatMB(Math.abs(r.queuedAtEnd - r.queuedAtStart))})`,
    r.nonReaders === 0 ? '—' : formatCount(r.nonReaderTokensWhileReading),
    `${((100 * r.serverCpuSeconds) / r.seconds).toFixed(0)}% / ${((100 * r.clientCpuSeconds) / r.seconds).toFixed(0)}%`,
  ]);

  const find = (server: ServerKind, stalled: boolean) => results.find((r) => r.server === server && r.stalled === stalled);
  const ratio = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined ? NaN : a / b);
  const comparisonHeader = [
    'server',
    "readers' p99 with non-readers ÷ without",
    'tokens/s with ÷ without',
    'peak RSS with ÷ without',
    'p99 ÷ sluice (all read / with non-readers)',
    'peak RSS ÷ sluice (all read / with non-readers)',
  ];
  const comparisonRows: string[][] = [];
  const checks: TargetCheck[] = [];
  for (const server of ['sluice', 'naive'] as const) {
    const without = find(server, false);
    const withStalled = find(server, true);
    if (without === undefined && withStalled === undefined) continue;
    const p99Ratio = ratio(withStalled?.p99Median, without?.p99Median);
    const vsSluice = (pick: (r: WsLoadResult) => number) =>
      [false, true]
        .map((stalled) => {
          const mine = find(server, stalled);
          const sluice = find('sluice', stalled);
          return mine === undefined || sluice === undefined ? '—' : formatRatio(pick(mine) / pick(sluice));
        })
        .join(' / ');
    comparisonRows.push([
      label(server),
      `${formatRatio(p99Ratio)}${Number.isFinite(p99Ratio) ? ` (target ≤ ${TARGET_P99_RATIO}×: ${p99Ratio <= TARGET_P99_RATIO ? 'PASS' : 'MISS'})` : ''}`,
      formatRatio(ratio(withStalled?.tokensPerSecond, without?.tokensPerSecond)),
      formatRatio(ratio(withStalled?.report.peakRss, without?.report.peakRss)),
      server === 'sluice' ? 'reference' : vsSluice((r) => r.p99Median),
      server === 'sluice' ? 'reference' : vsSluice((r) => r.report.peakRss),
    ]);
    if (server !== 'sluice' || withStalled === undefined) continue;
    if (without !== undefined) {
      checks.push(
        target(
          `WebSocket: readers' p99 token latency (median of rounds) with ${withStalled.nonReaders} non-readers ÷ without (×)`,
          p99Ratio,
          '×',
          'le',
          TARGET_P99_RATIO,
        ),
      );
    }
    // What sluice may queue for a socket that does not read: up to the high-water mark, plus the frame that crossed it.
    const bound = Math.ceil(((withStalled.nonReaders * (SLUICE_HIGH_WATER_MARK + 1024) + (without?.report.peakBuffered ?? 0)) / 2 ** 20) * 100) / 100;
    checks.push(
      target(
        `WebSocket: bytes queued in the server with ${withStalled.nonReaders} non-readers, peak (MB)`,
        withStalled.report.peakBuffered / 2 ** 20,
        'MB',
        'le',
        bound,
      ),
    );
  }

  // Issue 25's targets against the naive loop, from the same run: at least its tokens/s, at most 1.1× its peak RSS.
  const sluiceAll = find('sluice', false);
  const naiveAll = find('naive', false);
  if (sluiceAll !== undefined && naiveAll !== undefined) {
    checks.push(
      target('WebSocket, 1,000 clients all reading: tokens/s, sluice ÷ naive loop (×)', sluiceAll.tokensPerSecond / naiveAll.tokensPerSecond, '×', 'ge', 1),
    );
    checks.push(
      target('WebSocket, 1,000 clients all reading: peak RSS, sluice ÷ naive loop (×)', sluiceAll.report.peakRss / naiveAll.report.peakRss, '×', 'le', 1.1),
    );
  }

  const notes: string[] = [];
  for (const r of results) {
    const problems = [
      Object.keys(r.errors).length > 0 ? `error frames: ${counts(r.errors)}` : '',
      Object.keys(r.readerCloses).length > 0 ? `readers closed early: ${counts(r.readerCloses)}` : '',
      Object.keys(r.report.closes).length > 0 ? `server closed: ${counts(r.report.closes)}` : '',
      r.receivedTokens !== r.expectedTokens ? `received ${r.receivedTokens} of ${r.expectedTokens} tokens` : '',
      r.partial ? 'cut short by BENCH_WS_DEADLINE_MS' : '',
      r.fill !== undefined && r.fill.stuck < r.nonReaders
        ? `only ${r.fill.stuck} of ${r.nonReaders} non-readers had filled the kernel's buffers when the readers started (their requests were all sent, or BENCH_WS_FILL_MS ran out)`
        : '',
    ].filter((p) => p !== '');
    const spread = Math.max(...r.roundP99) / Math.min(...r.roundP99);
    if (spread > 2)
      problems.push(
        `p99 varied ${formatRatio(spread)} between rounds (load average ${r.loadAverage.toFixed(2)} on ${cpus().length} cores): the machine was busy, compare runs on a quiet one`,
      );
    if (problems.length > 0) notes.push(`${r.id}: ${problems.join('; ')}`);
    const fill =
      r.fill === undefined
        ? ''
        : `; before the readers started, the non-readers were served alone for ${r.fill.seconds.toFixed(1)} s until the kernel took no more: ${formatCount(r.fill.tokens)} tokens (${formatCount(Math.round(r.fill.tokens / r.nonReaders))} each), ${formatMB(r.fill.queued)} then queued in the server`;
    notes.push(
      `${r.id}: server RSS ${formatMB(r.report.baselineRss)} idle → ${formatMB(r.report.peakRss)} peak (heap in use at most ${formatMB(r.report.peakHeapUsed)}${r.report.liveHeap === undefined ? '' : `; live heap at most ${formatMB(r.report.liveHeap.peak)}, ${formatMB(r.report.liveHeap.now)} at the end`}); server event-loop delay while readers ran p99 ${ms(r.report.loopDelayP99)} ms (max ${ms(r.report.loopDelayMax)}); slowest reader done after ${r.slowestReader.toFixed(1)} s${fill}`,
    );
  }
  return { header, rows, comparisonHeader, comparisonRows, checks, notes };
}

/** The command line that runs this file alone. */
const COMMAND = 'node --conditions=sluice-source --import tsx bench/ws-load.ts';

async function main(): Promise<void> {
  const config = wsLoadConfig();
  const scenarios = wsScenarios().filter((s) => selected(s.id));
  const loadAtStart = loadavg()[0]!;
  console.log(`# sluice WebSocket load — ${new Date().toISOString()}`);
  console.log(`${cpus()[0]?.model ?? 'unknown cpu'}, ${cpus().length} cores, Node ${process.version}; load average (1 min) at start ${loadAtStart.toFixed(2)}`);
  console.log(`config: ${JSON.stringify(config)}`);
  const results = await measureWsLoad(scenarios, config, (message) => void process.stderr.write(`  · ${message}\n`));
  const report = wsLoadReport(results);
  console.log(`\n## WebSocket load — token latency generated → received, on loopback\n`);
  console.log(textTable(report.header, report.rows));
  console.log('');
  console.log(textTable(report.comparisonHeader, report.comparisonRows));
  console.log('');
  for (const note of report.notes) console.log(`  - ${note}`);
  if (report.checks.length > 0) {
    console.log('');
    console.log(
      textTable(
        ['target', 'measured', 'limit', 'result'],
        report.checks.map((c) => [
          c.what,
          c.measured.toFixed(2),
          `${c.comparison === 'ge' ? '≥' : c.comparison === 'lt' ? '<' : '≤'} ${c.limit.toFixed(2)}`,
          c.pass ? 'PASS' : 'MISS',
        ]),
      ),
    );
  }
  console.log(`\n## Markdown (for the README)\n`);
  console.log(
    `Measured with \`${COMMAND}\` on ${cpus()[0]?.model ?? 'unknown cpu'}, ${cpus().length} cores, Node ${process.version}, load average ${loadAtStart.toFixed(2)}.\n`,
  );
  console.log(`${markdownTable(report.header, report.rows)}\n`);
  console.log(`${markdownTable(report.comparisonHeader, report.comparisonRows)}\n`);
  console.log(`load average (1 min): ${loadAtStart.toFixed(2)} at start, ${loadavg()[0]!.toFixed(2)} at the end`);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) await main();
