/**
 * The server side of the WebSocket load bench (`ws-load.ts`), run in its own process
 * so that its RSS is its own and the 1,000 clients do not share its event loop.
 *
 *     node --conditions=sluice-source --import tsx bench/ws-load-server.ts <sluice|naive>
 *
 * It is forked by `ws-load.ts` (it needs an IPC channel) and speaks to it in three
 * messages: it sends `{ type: 'ready', port }` once it listens on 127.0.0.1, answers
 * `{ type: 'report', restart? }` with a `ServerReport` (`restart` starts a new event-loop
 * delay window), and exits on `{ type: 'exit' }`.
 *
 * Both servers speak the same `sluice.v1` frames and serve the same synthetic model: a
 * token is its generation time (the system-wide monotonic clock, in ms) as text, so the
 * client can measure how long each token took to reach it.
 *
 * - `sluice`: `attachTokenSocket` with a `TokenWorker` over `fromIterable`, so a token is
 *   generated only when the server grants demand, i.e. while the socket is writable.
 * - `naive`: a plain `ws` server that, for each `generate`, loops `ws.send(frame)` for
 *   every token without looking at `bufferedAmount`, yielding to the event loop with
 *   `setImmediate` every 32 tokens (the same turn budget as sluice's `FRAMES_PER_TURN`,
 *   so the one difference is the backpressure) and stopping once the socket is closed.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { readFileSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Worker } from 'node:worker_threads';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setImmediate as immediate } from 'node:timers/promises';
import { WebSocket, WebSocketServer } from 'ws';
import { fromIterable } from 'sluice';
import type { GenerateRequest, GenerationOptions, Token } from 'sluice/ai';
import { attachTokenSocket, createHttpHandler, type TokenSocket, type TokenWorker } from 'sluice/serve';
import type { LanguageModelV3StreamPart } from '@ai-sdk/provider';
import { simulateReadableStream, streamText } from 'ai';
import { MockLanguageModelV3 } from 'ai/test';
import { monotonicMs } from './harness.js';

export type ServerKind = 'sluice' | 'naive' | 'sluice-sse' | 'ai-sdk';
const KINDS: readonly string[] = ['sluice', 'naive', 'sluice-sse', 'ai-sdk'];

/** What the parent passes in the environment of the child. */
export interface ServerSettings {
  readonly kind: ServerKind;
  /** The bearer token clients must offer (`bearer.<token>` subprotocol). */
  readonly token: string;
  /** How many clients will connect: sluice's per-tenant quotas (every client is in one tenant) are sized from it. */
  readonly clients: number;
  /** sluice: how long a socket may stay above the high-water mark before it is closed with 4008. */
  readonly stallTimeout: number;
  /** sluice: the largest `max_tokens` a request may ask for. */
  readonly maxTokens: number;
  /** naive: tokens sent between two `setImmediate` yields. */
  readonly yieldEvery: number;
}

export interface ServerReport {
  /** RSS right after the server started listening, before any client connected. */
  readonly baselineRss: number;
  /** The peak RSS: the kernel's `VmHWM` where there is one, else the highest 20 ms sample. */
  readonly peakRss: number;
  readonly rss: number;
  /** The highest V8 heap in use seen by the 20 ms sampler (live objects and garbage not yet collected). */
  readonly peakHeapUsed: number;
  /**
   * Live heap (after a forced full GC, every 500 ms) when the server runs with `--expose-gc`
   * (`BENCH_WS_SERVER_FLAGS=--expose-gc`, a diagnostic: the GCs disturb the latency figures).
   */
  readonly liveHeap?: { readonly peak: number; readonly now: number };
  /** Highest sum over all sockets of the bytes queued in the process (`bufferedAmount`) seen by the 20 ms sampler. */
  readonly peakBuffered: number;
  /** The same sum now. */
  readonly buffered: number;
  /** Sockets with at least `STUCK_BYTES` queued in the process now: their kernel send buffer is full. */
  readonly stuck: number;
  /** Token frames the server generated (including those of clients that never read them). */
  readonly tokensGenerated: number;
  /** CPU seconds (user + system) since the process started. */
  readonly cpuSeconds: number;
  /** Event-loop delay p99 and max, ms, since the last report that asked to restart it (else since start). */
  readonly loopDelayP99: number;
  readonly loopDelayMax: number;
  /** Connections the server closed, by close cause (sluice only: `stalled` is a 4008). */
  readonly closes: Readonly<Record<string, number>>;
}

/** The synthetic frame's `traceparent`, for the naive server's `done` (sluice sends a real one of the same size). */
const TRACEPARENT = '00-0123456789abcdef0123456789abcdef-0123456789abcdef-01';
const SAMPLE_MS = 20;
const LIVE_HEAP_MS = 500;
/** Bytes queued in the process beyond which a socket counts as stuck: the kernel takes writes while it has room, so a queue this long means it has none. */
const STUCK_BYTES = 16 * 1024;

function settingsFromEnvironment(): ServerSettings {
  const kind = process.argv[2];
  if (kind === undefined || !KINDS.includes(kind)) throw new Error(`usage: ws-load-server.ts <${KINDS.join('|')}> (got ${kind ?? 'nothing'})`);
  const number = (name: string, fallback: number) => {
    const raw = process.env[name];
    const value = raw === undefined ? fallback : Number(raw);
    if (!Number.isFinite(value) || value < 1) throw new Error(`${name} must be a positive number, got "${raw}"`);
    return value;
  };
  return {
    kind: kind as ServerKind,
    token: process.env.WS_LOAD_TOKEN ?? 'bench-token',
    clients: number('WS_LOAD_CLIENTS', 1_000),
    stallTimeout: number('WS_LOAD_STALL_TIMEOUT', 180_000),
    maxTokens: number('WS_LOAD_MAX_TOKENS', 1_000_000),
    yieldEvery: number('WS_LOAD_YIELD_EVERY', 32),
  };
}

let tokensGenerated = 0;
/**
 * What the watchdog thread reads without the main thread: [0] tokens made, [1] when the main
 * thread's event loop last turned (ms since `EPOCH`, written by the 20 ms sampler).
 */
const shared = new Int32Array(new SharedArrayBuffer(8));
const EPOCH = Date.now();

/** Counts a token, where the watchdog can see it even while the event loop is held. */
function made(): void {
  shared[0] = ++tokensGenerated;
}

/**
 * A thread that writes, every 500 ms, what the parent needs when this process stops answering:
 * a server whose event loop is held (the AI SDK generating for non-readers in microtasks) cannot
 * send its report, and the parent reads this file instead (`WS_LOAD_WATCHDOG_FILE`).
 */
function startWatchdog(file: string | undefined): void {
  if (file === undefined || file === '') return;
  const source = `
    const { workerData } = require('node:worker_threads');
    const { readFileSync, writeFileSync } = require('node:fs');
    const shared = new Int32Array(workerData.buffer);
    const peak = () => { const m = /VmHWM:\\s+(\\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8')); return m ? Number(m[1]) * 1024 : 0; };
    setInterval(() => {
      const state = { tokensGenerated: Atomics.load(shared, 0), heldMs: Date.now() - workerData.epoch - Atomics.load(shared, 1), rss: process.memoryUsage.rss(), peakRss: peak() };
      writeFileSync(workerData.file, JSON.stringify(state));
    }, 500);
  `;
  new Worker(source, { eval: true, workerData: { buffer: shared.buffer, epoch: EPOCH, file } }).unref();
}

/**
 * One generation of the model: as fast as it is asked, one token per unit of demand, each
 * stamped when it is made. A module-level generator function, as the naive loop's is: a
 * generator function made per request also makes a prototype and a hidden class per request.
 */
function* syntheticTokens(limit: number, options: GenerationOptions | undefined): Generator<Token> {
  let index = 0;
  try {
    for (; index < limit; index++) {
      made();
      yield { text: monotonicMs().toFixed(3), index };
    }
  } finally {
    // Runs on completion and on cancel (the Flow calls `return()`), so `done` always carries usage.
    options?.onDone?.({
      finishReason: index >= limit ? 'length' : 'abort',
      usage: { inputTokens: 1, outputTokens: index },
      timeToFirstToken: undefined,
      tokensPerSecond: undefined,
    });
  }
}

/** The model. */
const syntheticWorker: TokenWorker = {
  name: 'synthetic',
  generate(request: GenerateRequest, options?: GenerationOptions) {
    return fromIterable<Token>(syntheticTokens(request.max_tokens ?? 16, options));
  },
};

function offeredProtocols(request: IncomingMessage): string[] {
  return (request.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim());
}

interface Running {
  close(): void;
  readonly closes: Record<string, number>;
}

function startSluice(server: ReturnType<typeof createServer>, settings: ServerSettings): Running {
  const closes: Record<string, number> = {};
  const socket: TokenSocket = attachTokenSocket(server, {
    worker: syntheticWorker,
    authenticate: (token) => (token === settings.token ? { tenant: 'bench' } : undefined),
    limits: {
      maxConcurrent: 8,
      // All clients share one tenant: a request each at once, and a new one each as often as they like.
      tenantConcurrent: settings.clients + 1,
      tenantRate: { perSecond: settings.clients * 10, burst: settings.clients * 2 },
      maxTokens: settings.maxTokens,
      stallTimeout: settings.stallTimeout,
      // A paused client cannot answer pings: the heartbeat must not end a non-reader mid-run either.
      heartbeatInterval: Math.max(30_000, settings.stallTimeout),
    },
    onEvent: (event) => {
      if (event.kind === 'closed' && event.cause !== 'client') closes[event.cause] = (closes[event.cause] ?? 0) + 1;
    },
  });
  return { close: () => socket.close(), closes };
}

function startNaive(server: ReturnType<typeof createServer>, settings: ServerSettings): Running {
  const wss = new WebSocketServer({
    server,
    perMessageDeflate: false,
    maxPayload: 64 * 1024,
    handleProtocols: (protocols) => (protocols.has('sluice.v1') ? 'sluice.v1' : false),
    verifyClient: ({ req }: { req: IncomingMessage }) => offeredProtocols(req).includes(`bearer.${settings.token}`),
  });
  const stream = async (ws: WebSocket, id: string, limit: number) => {
    for (let seq = 0; seq < limit; seq++) {
      if (ws.readyState !== WebSocket.OPEN) return;
      made();
      ws.send(JSON.stringify({ type: 'token', id, seq, text: monotonicMs().toFixed(3), tokens: 1 }));
      if ((seq + 1) % settings.yieldEvery === 0) await immediate();
    }
    if (ws.readyState !== WebSocket.OPEN) return;
    ws.send(JSON.stringify({ type: 'done', id, finish_reason: 'length', usage: { input_tokens: 1, output_tokens: limit }, traceparent: TRACEPARENT }));
  };
  wss.on('connection', (ws) => {
    ws.on('error', () => {});
    ws.on('message', (data) => {
      const message = JSON.parse(String(data)) as { type: string; id: string; parameters?: { max_tokens?: number } };
      if (message.type === 'generate') void stream(ws, message.id, message.parameters?.max_tokens ?? 16);
    });
  });
  return {
    close: () => {
      for (const ws of wss.clients) ws.terminate();
      wss.close();
    },
    closes: {},
  };
}

/**
 * sluice's OpenAI-compatible endpoint (`createHttpHandler`, `POST /v1/chat/completions` with
 * `stream: true`) over the same synthetic model: a token is asked of it only once the previous
 * one was accepted by the socket.
 */
function startSluiceSse(server: ReturnType<typeof createServer>, settings: ServerSettings): Running {
  const handler = createHttpHandler({ worker: syntheticWorker, maxTokens: settings.maxTokens });
  server.on('request', handler);
  return { close: () => {}, closes: {} };
}

/** The parts of one mock generation: `tokens` text deltas, each made (stamped and counted) only when the stream reads it. */
function lazyParts(tokens: number): ArrayLike<LanguageModelV3StreamPart> {
  const last = tokens + 3;
  return new Proxy([] as LanguageModelV3StreamPart[], {
    get(_, key) {
      if (key === 'length') return last + 1;
      const i = typeof key === 'string' ? Number(key) : Number.NaN;
      if (i === 0) return { type: 'stream-start', warnings: [] };
      if (i === 1) return { type: 'text-start', id: 't' };
      if (i < last - 1) {
        made();
        return { type: 'text-delta', id: 't', delta: monotonicMs().toFixed(3) };
      }
      if (i === last - 1) return { type: 'text-end', id: 't' };
      if (i === last) {
        return {
          type: 'finish',
          finishReason: { unified: 'length', raw: undefined },
          usage: {
            inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
            outputTokens: { total: tokens, text: tokens, reasoning: undefined },
          },
        };
      }
      return undefined;
    },
  });
}

/**
 * The Vercel AI SDK as its users serve a chat to browsers from Node: `streamText` over its
 * `MockLanguageModelV3`, whose stream is the SDK's own `simulateReadableStream` (no delays) of
 * the same tokens, piped to the response as a UI message stream (SSE) with
 * `pipeUIMessageStreamToResponse`; the request's `close` aborts it, as a careful user would wire it.
 */
function startAiSdk(server: ReturnType<typeof createServer>, settings: ServerSettings): Running {
  server.on('request', (request: IncomingMessage, response: ServerResponse) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { max_tokens?: number };
      const tokens = Math.min(body.max_tokens ?? 16, settings.maxTokens);
      const abort = new AbortController();
      response.once('close', () => abort.abort());
      const model = new MockLanguageModelV3({
        doStream: async () => ({
          stream: simulateReadableStream({ chunks: lazyParts(tokens) as LanguageModelV3StreamPart[], initialDelayInMs: null, chunkDelayInMs: null }),
        }),
      });
      const result = streamText({ model, prompt: 'load', abortSignal: abort.signal });
      result.pipeUIMessageStreamToResponse(response);
    });
  });
  return { close: () => {}, closes: {} };
}

/** `VmHWM` (peak resident set) of this process, bytes; undefined off Linux. */
function kernelPeakRss(): number | undefined {
  try {
    const match = /^VmHWM:\s+(\d+) kB/m.exec(readFileSync('/proc/self/status', 'utf8'));
    return match ? Number(match[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}

/**
 * With `BENCH_WS_HEAP_PROFILE=<dir>` (a diagnostic), V8's sampling heap profiler runs while the readers
 * run, counting objects that GC already collected too: where the garbage is allocated, not what is live
 * at the end (`--heap-prof` keeps only the latter). Written to `<dir>/<kind>-<pid>.heapprofile`
 * (open it in Chrome DevTools' Memory tab, or sum it by function). With `BENCH_WS_HEAP_PROFILE_MINOR=0`
 * it leaves out what scavenges collected (and runs one first): what was promoted, the garbage that sets the peak.
 */
function allocationSampler(kind: ServerKind): { start(): void; stop(): void } | undefined {
  const dir = process.env.BENCH_WS_HEAP_PROFILE;
  if (dir === undefined || dir === '') return undefined;
  // BENCH_WS_HEAP_PROFILE_MINOR=0: leave out what scavenges collected, so the profile holds what was promoted (or is still live).
  const minor = process.env.BENCH_WS_HEAP_PROFILE_MINOR !== '0';
  const session = new Session();
  session.connect();
  let sampling = false;
  return {
    start() {
      if (sampling) return;
      sampling = true;
      session.post('HeapProfiler.startSampling', {
        samplingInterval: 4096,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: minor,
      });
    },
    stop() {
      if (!sampling) return;
      sampling = false;
      // A scavenge first, so that young garbage not yet collected is not counted as kept (a profile without minor GC's dead).
      if (!minor) {
        setFlagsFromString('--expose-gc');
        (runInNewContext('gc') as (options: { type: 'minor' }) => void)({ type: 'minor' });
      }
      // The in-process session answers synchronously: the file is written before the report goes out.
      session.post('HeapProfiler.stopSampling', (err, result) => {
        if (err === null) writeFileSync(`${dir}/${kind}-${process.pid}.heapprofile`, JSON.stringify(result.profile));
      });
    },
  };
}

async function main(): Promise<void> {
  const settings = settingsFromEnvironment();
  if (process.send === undefined) throw new Error('ws-load-server.ts is forked by bench/ws-load.ts (it needs an IPC channel)');
  const sse = settings.kind === 'sluice-sse' || settings.kind === 'ai-sdk';
  const server = sse ? createServer({ keepAliveTimeout: 600_000 }) : createServer((_, response) => response.writeHead(404).end());
  // Both servers' sockets, watched the same way: what a socket has queued in the process is what `bufferedAmount` reports.
  const sockets = new Set<Duplex>();
  server.on('upgrade', (_request: IncomingMessage, socket: Duplex) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  const queued = () => {
    let buffered = 0;
    let stuck = 0;
    for (const socket of sockets) {
      buffered += socket.writableLength;
      if (socket.writableLength >= STUCK_BYTES) stuck++;
    }
    return { buffered, stuck };
  };
  // The SSE servers' sockets are watched the same way: what the response has queued in the process.
  if (settings.kind === 'sluice-sse' || settings.kind === 'ai-sdk') {
    server.on('connection', (socket: Duplex) => {
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
    });
  }
  const start = { sluice: startSluice, naive: startNaive, 'sluice-sse': startSluiceSse, 'ai-sdk': startAiSdk }[settings.kind];
  const running = start(server, settings);
  await new Promise<void>((resolve) => server.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('no TCP address');

  const delay = monitorEventLoopDelay({ resolution: 10 });
  delay.enable();
  const baselineRss = process.memoryUsage.rss();
  let peakRss = baselineRss;
  let peakHeapUsed = 0;
  let peakBuffered = 0;
  startWatchdog(process.env.WS_LOAD_WATCHDOG_FILE);
  const sampler = setInterval(() => {
    shared[1] = Date.now() - EPOCH;
    const memory = process.memoryUsage();
    peakRss = Math.max(peakRss, memory.rss);
    peakHeapUsed = Math.max(peakHeapUsed, memory.heapUsed);
    peakBuffered = Math.max(peakBuffered, queued().buffered);
  }, SAMPLE_MS);
  const gc = (globalThis as { gc?: () => void }).gc;
  let liveHeap: { peak: number; now: number } | undefined;
  const liveSampler =
    gc === undefined
      ? undefined
      : setInterval(() => {
          gc();
          const now = process.memoryUsage().heapUsed;
          liveHeap = { peak: Math.max(liveHeap?.peak ?? 0, now), now };
        }, LIVE_HEAP_MS);

  const allocations = allocationSampler(settings.kind);
  process.on('message', (message: { type: string; restart?: boolean }) => {
    if (message.type === 'report') {
      if (message.restart === true) allocations?.start();
      else allocations?.stop();
      const cpu = process.cpuUsage();
      const now = queued();
      const report: ServerReport = {
        baselineRss,
        peakRss: Math.max(peakRss, kernelPeakRss() ?? 0),
        rss: process.memoryUsage.rss(),
        peakHeapUsed,
        ...(liveHeap !== undefined && { liveHeap }),
        peakBuffered: Math.max(peakBuffered, now.buffered),
        buffered: now.buffered,
        stuck: now.stuck,
        tokensGenerated,
        cpuSeconds: (cpu.user + cpu.system) / 1e6,
        loopDelayP99: delay.percentile(99) / 1e6,
        loopDelayMax: delay.max / 1e6,
        closes: running.closes,
      };
      process.send!({ type: 'report', report });
      if (message.restart === true) delay.reset();
    } else if (message.type === 'exit') {
      clearInterval(sampler);
      clearInterval(liveSampler);
      delay.disable();
      running.close();
      server.close();
      process.disconnect();
      // Sockets the clients left half-open must not keep the process alive.
      setTimeout(() => process.exit(0), 200).unref();
    }
  });
  process.send({ type: 'ready', port: address.port });
}

await main();
