/**
 * The WebSocket token server: `attachTokenSocket(httpServer, options)` takes over the
 * `upgrade` requests of a `node:http` server and streams generations over the
 * `sluice.v1` protocol (see `protocol.ts`).
 *
 * Each connection owns its requests (multiplexed by `id`); each request is its model's
 * token `Flow` subscribed with explicit demand, and demand is granted only while the
 * socket's `bufferedAmount` is under the high-water mark, so a client that does not
 * read stops its model from decoding instead of filling server memory.
 *
 * Security is checked before a connection exists, in this order:
 *
 * 1. Origin allow-list: a foreign `Origin` gets HTTP 403 and never a socket (a cross-site
 *    page must not learn more than that).
 * 2. Bearer token, from `Authorization` or a `bearer.<token>` subprotocol: missing or
 *    invalid is HTTP 401 with `WWW-Authenticate: Bearer`.
 * 3. Subprotocol `sluice.v1`, else HTTP 400.
 * 4. While draining, HTTP 503.
 *
 * An HTTP refusal answers and destroys the socket. A browser cannot see it, though: its
 * WebSocket API reports 1006 for any failed handshake, so a page cannot tell a bad token
 * from a server that is down. So a request that carries an `Origin` (browsers always
 * send one) from an allowed origin and offers `sluice.v1` is refused after the handshake
 * instead: the server completes it and closes at once with 4401 (`unauthorized: ...`:
 * stop retrying, ask for a token) for 2, or 1013 (`try again later: ...`: reconnect with
 * backoff, another instance may answer) for 4. 1013 rather than 503: a 503 looks to the
 * page exactly like a server that is down, and 1001 is what an open connection gets when
 * the server goes away; 1013 says the refusal is temporary. Such a socket never becomes a
 * connection: it has no message listener (a frame it sends is read and dropped), holds no
 * tenant slot, is not counted in `connections`, and a peer that does not answer the close
 * within `REFUSAL_CLOSE_TIMEOUT` (1 s) is terminated. Clients without `Origin` (curl,
 * servers) keep the HTTP status. Every refusal, either way, is an `upgrade-rejected`
 * event (with `closeCode` when it was a close) and counts in `upgradesRejected`
 * (`sluice_ws_upgrades_rejected_total{status}`).
 *
 * After admission the server greets first, before any other frame: one `hello`
 * (`HelloFrame`) with the connection's number, its tenant, the model names and the
 * limits a client must stay within — a small `maxPayload`, per-connection concurrency
 * and message-rate limits, per-tenant concurrency and request-rate quotas, the
 * `maxTokens` cap, and the ping/pong heartbeat's interval.
 */
import type { IncomingMessage, Server as HttpServer } from 'node:http';
import type { Duplex } from 'node:stream';
import * as z from 'zod';
import type { WebSocketServer, WebSocket, RawData } from 'ws';
import { wsPeer } from '../core/peers.js';
import { subscribeWithDemand, type DemandSubscription } from '../flow/demand.js';
import { functionSchema, parseOptions, positiveInt } from '../flow/options.js';
import { SluiceError } from '../core/errors.js';
import { TokenBuckets } from '../core/token-bucket.js';
import { parseTraceparent, sampler, traced, type TraceContext } from '../core/trace.js';
import { generateRequest, type GenerateRequest, type GenerationDone, type ModelWorker, type Token } from '../ai/inference/worker.js';
import type { SluiceMetrics } from './metrics.js';
import type { Tracer } from '@opentelemetry/api';
import { endGenAiSpan, errorType, genAiSpan, recordStageSpans, traceparentOf, type GenAiSpan } from './otel.js';
import {

  BEARER_PROTOCOL_PREFIX,
  CLOSE_CODES,
  SUBPROTOCOL,
  bearerOf,
  parseClientFrame,
  pathOf,
  type ErrorFrame,
  type GenerateMessage,
  type HelloLimits,
  type ProtocolErrorCode,
  type RequestErrorCode,
  type ServerFrame,
} from './protocol.js';

import type { RefusalStatus, TokenSocketStats } from './socket-stats.js';
export type { RefusalStatus, TokenSocketStats } from './socket-stats.js';

const wsLib = wsPeer();

/** What the server needs of a model: its name and a token Flow. Every `ModelWorker` fits. */
export type TokenWorker = Pick<ModelWorker<never, unknown>, 'name' | 'generate'>;

/** Who a token belongs to. Quotas are kept per `tenant`. */
export interface Principal {
  readonly tenant: string;
}

/** Checks a bearer token; `undefined` (or a throw) refuses the upgrade with 401 (a browser: close 4401 after the handshake). */
export type Authenticate = (token: string, request: IncomingMessage) => Principal | undefined | Promise<Principal | undefined>;

/**
 * The server's limits. The ones a client must stay within (`maxTokens`, `maxConcurrent`,
 * `rate`, `tenantConcurrent`, `tenantRate`, `maxPayload`, `heartbeatInterval`) are
 * announced to each connection in its `hello` frame.
 */
export interface TokenSocketLimits {
  /** Largest frame a client may send, bytes; larger ones close the connection with 1009. Default 64 KiB. */
  readonly maxPayload: number;
  /** Requests one connection may run at once. Default 8. */
  readonly maxConcurrent: number;
  /** Frames a connection may send: `perSecond` on average, `burst` at once. Default 20/s, burst 40. */
  readonly rate: { readonly perSecond: number; readonly burst: number };
  /** Requests one tenant may run at once, across its connections. Default 32. */
  readonly tenantConcurrent: number;
  /** Requests one tenant may start, across its connections: `perSecond` on average, `burst` at once. Default 50/s, burst 100. */
  readonly tenantRate: { readonly perSecond: number; readonly burst: number };
  /** Bytes buffered for a socket above which no more tokens are decoded for it. Default 64 KiB. */
  readonly highWaterMark: number;
  /** Bytes buffered for a socket beyond which it is closed at once with 4008 (error frames are not paced by demand). Default 1 MiB. */
  readonly maxBuffered: number;
  /** How long, ms, a socket may stay above the high-water mark before it is closed with 4008. Default 10 s. */
  readonly stallTimeout: number;
  /** Protocol errors in a row that close the connection with 1008. Default 5. */
  readonly maxBadFrames: number;
  /** Ping every this many ms; a connection that did not answer the previous ping is terminated. Default 30 s. */
  readonly heartbeatInterval: number;
  /** The largest `max_tokens` a request may ask for. Default 4096. */
  readonly maxTokens: number;
  /** Characters a `conflate` request may hold while its client is slow; decoding pauses beyond. Default 16 Ki. */
  readonly conflateLimit: number;
}

/** What the server reports for logs. Never carries a token or a prompt. */
export type TokenSocketEvent =
  /** `closeCode` is set when a browser was refused after the handshake (4401, 1013) rather than with the HTTP `status`. */
  | { readonly kind: 'upgrade-rejected'; readonly status: RefusalStatus; readonly reason: string; readonly closeCode?: RefusalCloseCode }
  | { readonly kind: 'connected'; readonly connection: number; readonly tenant: string }
  | { readonly kind: 'bad-frame'; readonly connection: number; readonly code: ProtocolErrorCode }
  | { readonly kind: 'refused'; readonly connection: number; readonly code: RequestErrorCode | (string & {}) }
  | { readonly kind: 'closed'; readonly connection: number; readonly tenant: string; readonly code: number; readonly cause: CloseCause };



/** The close code that refuses a browser after the handshake: 4401 unauthorized, 1013 try again later. */
export type RefusalCloseCode = typeof CLOSE_CODES.unauthorized | typeof CLOSE_CODES.tryAgainLater;

/** Why a connection ended. */
export type CloseCause = 'client' | 'bad-frames' | 'stalled' | 'heartbeat' | 'shutdown';

export interface TokenSocketOptions {
  /** The model that generates. Give this or `workers`. */
  readonly worker?: TokenWorker;
  /** Several models, chosen by the message's `model` (default: the first). */
  readonly workers?: Readonly<Record<string, TokenWorker>>;
  /**
   * Checks the bearer token of each upgrade. Without it connections are not
   * authenticated (every one is tenant `anonymous`): only for a server on loopback.
   */
  readonly authenticate?: Authenticate;
  /**
   * Origins browsers may connect from, or a check of the `Origin` header; another origin gets 403.
   * Requests without `Origin` (non-browser clients) pass. Default: any.
   */
  readonly origins?: readonly string[] | ((origin: string, request: IncomingMessage) => boolean);
  /** Only upgrades to this path are handled; others are left to other `upgrade` listeners. Default: every path. */
  readonly path?: string;
  readonly limits?: Partial<TokenSocketLimits>;
  readonly onEvent?: (event: TokenSocketEvent) => void;
  /** Exports connection and request counters (`sluice_ws_*`) and observes each request's trace and generation. */
  readonly metrics?: SluiceMetrics;
  /** Names this server in metrics. Default `ws`. */
  readonly name?: string;
  /** The OpenTelemetry tracer for request and stage spans. Default: the global provider's (a no-op unless an SDK is registered). */
  readonly tracer?: Tracer;
  /** Share of requests whose per-stage timing is recorded (metrics, stage spans); a sampled incoming traceparent always is. Default 1. */
  readonly sampleRate?: number;
}


/** What `drain()` reports. */
export interface DrainReport {
  /** Requests running when the drain began. */
  readonly running: number;
  /** Of those, how many ended on their own (done, error or client cancel) before the deadline. */
  readonly finished: number;
  /** Of those, how many were cut off at the deadline with a `SHUTDOWN` error frame. */
  readonly interrupted: number;
}

/** The handle `attachTokenSocket` returns. */
export interface TokenSocket {
  stats(): TokenSocketStats;
  /** Stops accepting upgrades, closes every connection with 1001 and cancels their requests. */
  close(): void;
  /**
   * Graceful shutdown: refuses new upgrades (503; a browser: close 1013) and new requests (`SHUTTING_DOWN`
   * error frame), lets running requests finish for up to `deadline` ms, then ends the
   * rest with a `SHUTDOWN` error frame; finally closes every connection with 1001.
   * Every request running at the start ends with `done` or `error`, never silently.
   */
  drain(deadline: number): Promise<DrainReport>;
  /** True once `drain()` or `close()` was called. */
  readonly draining: boolean;
}

const DEFAULT_LIMITS: TokenSocketLimits = {
  maxPayload: 64 * 1024,
  maxConcurrent: 8,
  rate: { perSecond: 20, burst: 40 },
  tenantConcurrent: 32,
  tenantRate: { perSecond: 50, burst: 100 },
  highWaterMark: 64 * 1024,
  maxBuffered: 1024 * 1024,
  stallTimeout: 10_000,
  maxBadFrames: 5,
  heartbeatInterval: 30_000,
  maxTokens: 4096,
  conflateLimit: 16 * 1024,
};

const workerSchema = z.custom<TokenWorker>(
  (v) => typeof v === 'object' && v !== null && typeof (v as TokenWorker).generate === 'function' && typeof (v as TokenWorker).name === 'string',
  { error: 'must be a ModelWorker (with name and generate())' },
);

const limitsSchema = z
  .object({
    maxPayload: positiveInt('maxPayload'),
    maxConcurrent: positiveInt('maxConcurrent'),
    rate: z.object({ perSecond: z.number().positive({ error: 'perSecond must be > 0' }), burst: z.number().min(1, { error: 'burst must be ≥ 1' }) }).strict(),
    tenantConcurrent: positiveInt('tenantConcurrent'),
    tenantRate: z.object({ perSecond: z.number().positive({ error: 'perSecond must be > 0' }), burst: z.number().min(1, { error: 'burst must be ≥ 1' }) }).strict(),
    highWaterMark: positiveInt('highWaterMark'),
    maxBuffered: positiveInt('maxBuffered'),
    stallTimeout: positiveInt('stallTimeout'),
    maxBadFrames: positiveInt('maxBadFrames'),
    heartbeatInterval: positiveInt('heartbeatInterval'),
    maxTokens: positiveInt('maxTokens'),
    conflateLimit: positiveInt('conflateLimit'),
  })
  .strict()
  .refine((l) => l.maxBuffered > l.highWaterMark, { error: 'maxBuffered must be greater than highWaterMark', path: ['maxBuffered'] });

const optionsSchema = z
  .object({
    worker: workerSchema.optional(),
    workers: z.record(z.string(), workerSchema).optional(),
    authenticate: functionSchema<Authenticate>().optional(),
    origins: z
      .union([z.array(z.string().min(1, { error: 'an origin must not be empty' })), functionSchema<(origin: string, request: IncomingMessage) => boolean>()], { error: 'origins must be an array of strings or a function' })
      .optional(),
    path: z.string().startsWith('/', { error: 'path must start with "/"' }).optional(),
    limits: z.unknown().optional(),
    onEvent: functionSchema<(event: TokenSocketEvent) => void>().optional(),
    metrics: z.custom<SluiceMetrics>((v) => typeof v === 'object' && v !== null && typeof (v as SluiceMetrics).registerSocket === 'function', { error: 'metrics must be a SluiceMetrics' }).optional(),
    name: z.string().min(1, { error: 'name must not be empty' }).default('ws'),
    sampleRate: z.number({ error: 'sampleRate must be a number' }).min(0, { error: 'sampleRate must be in [0, 1]' }).max(1, { error: 'sampleRate must be in [0, 1]' }).default(1),
    tracer: z.custom<Tracer>((v) => typeof v === 'object' && v !== null && typeof (v as Tracer).startSpan === 'function', { error: 'tracer must be an OpenTelemetry Tracer' }).optional(),
  })
  .strict()
  .refine((o) => (o.worker === undefined) !== (o.workers === undefined || Object.keys(o.workers).length === 0), {
    error: 'give exactly one of worker or workers (non-empty)',
    path: ['worker'],
  });

/**
 * Serves token streams over WebSocket on `server`'s `upgrade` event.
 *
 * Every connection is greeted with one `hello` frame (its tenant, the model names, the
 * limits it must stay within) before any other frame.
 *
 * Close codes: 1001 shutdown, 1008 after `maxBadFrames` protocol errors in a row, 1009
 * for a frame above `maxPayload` (by `ws`), 1007 for invalid UTF-8 (by `ws`), 4008 for a
 * client that does not read; a refused browser gets 4401 (bad token) or 1013 (draining)
 * right after the handshake. A missed pong terminates the socket. Every other refusal
 * (rate, concurrency, quota, bad parameters, duplicate id) is a typed `error` frame and
 * the connection stays open.
 *
 * ## Example
 * ```ts
 * const server = createServer(routes);
 * const tokens = attachTokenSocket(server, {
 *   worker: await CharLmWorker.load('models/charlm.onnx'),
 *   authenticate: (token) => (token === process.env.SLUICE_TOKEN ? { tenant: 'default' } : undefined),
 *   origins: ['https://app.example.com'],
 *   path: '/v1/stream',
 * });
 * server.listen(8080);
 * // later: tokens.close(); server.close();
 * ```
 */
export function attachTokenSocket(server: HttpServer, options: TokenSocketOptions): TokenSocket {
  const parsed = parseOptions(optionsSchema, options, 'token socket options');
  const limits = parseOptions(limitsSchema, { ...DEFAULT_LIMITS, ...(parsed.limits as object | undefined) }, 'token socket limits');
  const hub = new Hub(server, parsed, limits);
  return {
    stats: () => hub.stats(),
    close: () => hub.close(),
    drain: (deadline) => hub.drain(deadline),
    get draining() {
      return hub.draining;
    },
  };
}

type Config = z.output<typeof optionsSchema>;

/** Everything shared by a server's connections: the upgrade gate, tenants, heartbeat and counters. */
class Hub {
  readonly connections = new Set<Connection>();
  readonly rate: TokenBuckets;
  readonly tenantRate: TokenBuckets;
  private readonly tenants = new Map<string, number>();
  private readonly wss: WebSocketServer;
  private readonly heartbeat: NodeJS.Timeout;
  private readonly workers: ReadonlyMap<string, TokenWorker>;
  /** What every connection's `hello` announces: the model names (the default first) and the client-facing limits. */
  private readonly models: readonly string[];
  private readonly clientLimits: HelloLimits;
  private readonly onUpgrade: (request: IncomingMessage, socket: Duplex, head: Buffer) => void;
  private numbering = 0;
  /** Token frames the server may still send this turn, and the connections waiting for the next. */
  private turnBudget = FRAMES_PER_SERVER_TURN;
  private readonly waiting = new Set<Connection>();
  private nextTurn: NodeJS.Immediate | undefined;
  /** Requests started, numbering their traces. */
  seq = 0;
  readonly sample: (seq: number) => boolean;
  private shut = false;
  private draining_ = false;
  private drained: (() => void) | undefined;
  counters = { started: 0, completed: 0, cancelled: 0, failed: 0, interrupted: 0, badFrames: 0 };
  private readonly rejected: Record<RefusalStatus, number> = { 400: 0, 401: 0, 403: 0, 503: 0 };
  /** Browsers refused after the handshake, each with the timer that terminates it if its close does not complete. */
  private readonly refusing = new Map<WebSocket, NodeJS.Timeout>();

  constructor(
    private readonly server: HttpServer,
    private readonly config: Config,
    readonly limits: TokenSocketLimits,
  ) {
    this.workers = new Map(config.worker !== undefined ? [[config.worker.name, config.worker]] : Object.entries(config.workers ?? {}));
    // Map order is the workers' order, so the first name is the default `worker()` picks.
    this.models = [...this.workers.keys()];
    const { maxTokens, maxConcurrent, rate, tenantConcurrent, tenantRate, maxPayload, heartbeatInterval } = limits;
    this.clientLimits = { maxTokens, maxConcurrent, rate, tenantConcurrent, tenantRate, maxPayload, heartbeatInterval };
    this.rate = new TokenBuckets(limits.rate.perSecond, limits.rate.burst, () => performance.now());
    this.sample = sampler(config.sampleRate);
    this.tenantRate = new TokenBuckets(limits.tenantRate.perSecond, limits.tenantRate.burst, () => performance.now());
    this.wss = new wsLib.WebSocketServer({
      noServer: true,
      maxPayload: limits.maxPayload,
      perMessageDeflate: false,
      // Only the versioned protocol is ever selected: a `bearer.*` entry must never be echoed back.
      handleProtocols: (protocols) => (protocols.has(SUBPROTOCOL) ? SUBPROTOCOL : false),
    });
    this.onUpgrade = (request, socket, head) => {
      if (this.config.path !== undefined && pathOf(request.url) !== this.config.path) return;
      void this.admit(request, socket, head);
    };
    server.on('upgrade', this.onUpgrade);
    this.heartbeat = setInterval(() => {
      for (const connection of this.connections) connection.beat();
    }, limits.heartbeatInterval);
    this.heartbeat.unref();
    config.metrics?.registerSocket(config.name, () => this.stats());
  }

  get metrics(): SluiceMetrics | undefined {
    return this.config.metrics;
  }

  get tracer(): Tracer | undefined {
    return this.config.tracer;
  }

  get draining(): boolean {
    return this.draining_ || this.shut;
  }

  emit(event: TokenSocketEvent): void {
    try {
      this.config.onEvent?.(event);
    } catch {
      // a failing log hook must not take a connection down
    }
  }

  worker(model: string | undefined): TokenWorker | undefined {
    if (model === undefined) return this.workers.values().next().value;
    return this.workers.get(model);
  }

  acquireTenant(tenant: string): boolean {
    const running = this.tenants.get(tenant) ?? 0;
    if (running >= this.limits.tenantConcurrent) return false;
    this.tenants.set(tenant, running + 1);
    return true;
  }

  releaseTenant(tenant: string): void {
    const running = (this.tenants.get(tenant) ?? 1) - 1;
    if (running <= 0) this.tenants.delete(tenant);
    else this.tenants.set(tenant, running);
  }

  private async admit(request: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    // A peer resetting during authentication must not raise an unhandled 'error'.
    const ignore = () => {};
    socket.on('error', ignore);
    const origin = request.headers.origin;
    if (origin !== undefined && !this.originAllowed(origin, request)) {
      return this.refuse(request, socket, head, 403, 'origin not allowed');
    }
    const offered = protocolsOf(request.headers['sec-websocket-protocol']);
    const token = bearerOf(request.headers.authorization) ?? offered.find((p) => p.startsWith(BEARER_PROTOCOL_PREFIX))?.slice(BEARER_PROTOCOL_PREFIX.length);
    let principal: Principal | undefined = this.config.authenticate === undefined ? { tenant: 'anonymous' } : undefined;
    if (this.config.authenticate !== undefined && token !== undefined && token.length > 0) {
      try {
        principal = await this.config.authenticate(token, request);
      } catch {
        principal = undefined;
      }
    }
    if (principal === undefined || typeof principal.tenant !== 'string') return this.refuse(request, socket, head, 401, 'missing or invalid bearer token');
    if (!offered.includes(SUBPROTOCOL)) return this.refuse(request, socket, head, 400, `subprotocol ${SUBPROTOCOL} required`);
    if (this.draining_) return this.refuse(request, socket, head, 503, 'the server is shutting down');
    if (this.shut || socket.destroyed) return void socket.destroy();
    const tenant = principal.tenant;
    this.wss.handleUpgrade(request, socket, head, (ws) => {
      socket.off('error', ignore);
      if (this.shut) return void ws.terminate();
      const connection = new Connection(this, ws, ++this.numbering, tenant);
      this.connections.add(connection);
      // The greeting goes first: no frame of this connection can be sent before it.
      connection.send({ type: 'hello', protocol: SUBPROTOCOL, connection: connection.number, tenant, models: this.models, limits: this.clientLimits });
      this.emit({ kind: 'connected', connection: connection.number, tenant });
    });
  }

  private originAllowed(origin: string, request: IncomingMessage): boolean {
    const allowed = this.config.origins;
    if (allowed === undefined) return true;
    if (typeof allowed !== 'function') return allowed.includes(origin);
    try {
      return allowed(origin, request) === true;
    } catch {
      return false;
    }
  }

  /**
   * Refuses an upgrade: with a close code after the handshake for a browser that can be
   * told no other way (see the module comment), else with the HTTP status.
   */
  private refuse(request: IncomingMessage, socket: Duplex, head: Buffer, status: RefusalStatus, reason: string): void {
    this.rejected[status]++;
    const close = status === 401 || status === 503 ? CLOSE_REFUSALS[status] : undefined;
    // The handshake can complete only if the browser's subprotocol can be selected, and only while the `ws` server is open.
    const byClose = close !== undefined && request.headers.origin !== undefined && !this.shut && !socket.destroyed && protocolsOf(request.headers['sec-websocket-protocol']).includes(SUBPROTOCOL);
    if (byClose) {
      this.emit({ kind: 'upgrade-rejected', status, reason, closeCode: close.code });
      return this.refuseAfterHandshake(request, socket, head, close.code, `${close.prefix}: ${reason}`);
    }
    this.emit({ kind: 'upgrade-rejected', status, reason });
    if (socket.destroyed) return;
    const [code, title] = REFUSALS[status];
    const body = JSON.stringify({ error: { code, message: reason } });
    const headers = [
      `HTTP/1.1 ${status} ${title}`,
      'Connection: close',
      'Content-Type: application/json',
      `Content-Length: ${Buffer.byteLength(body)}`,
      ...(status === 401 ? ['WWW-Authenticate: Bearer'] : []),
    ];
    // Destroy only once the answer is flushed, or the client may see a reset instead of the status.
    socket.once('finish', () => socket.destroy());
    socket.end(`${headers.join('\r\n')}\r\n\r\n${body}`);
  }

  /**
   * Completes the handshake and closes at once with `code`. The socket never becomes a
   * `Connection`: no message listener (frames are read and dropped), no tenant, no
   * heartbeat; a peer that does not answer the close within `REFUSAL_CLOSE_TIMEOUT` is
   * terminated, so a refused socket costs at most that long.
   */
  private refuseAfterHandshake(request: IncomingMessage, socket: Duplex, head: Buffer, code: RefusalCloseCode, reason: string): void {
    this.wss.handleUpgrade(request, socket, head, (ws) => {
      // ws owns the socket's errors from here; its own 'error' must not be unhandled.
      ws.on('error', () => {});
      const timer = setTimeout(() => ws.terminate(), REFUSAL_CLOSE_TIMEOUT);
      this.refusing.set(ws, timer);
      ws.once('close', () => {
        clearTimeout(timer);
        this.refusing.delete(ws);
      });
      ws.close(code, reason);
    });
  }

  stats(): TokenSocketStats {
    let activeRequests = 0;
    let timers = 0;
    let buffered = 0;
    for (const connection of this.connections) {
      activeRequests += connection.streams.size;
      buffered += connection.ws.bufferedAmount;
      timers += connection.timers();
    }
    timers += this.refusing.size;
    return { connections: this.connections.size, activeRequests, buffered, timers, tenants: Object.fromEntries(this.tenants), ...this.counters, upgradesRejected: { ...this.rejected } };
  }

  /** True while this turn's server-wide budget lasts; otherwise queues `connection` for the next turn. */
  inTurn(connection: Connection): boolean {
    if (this.turnBudget > 0) return true;
    this.waiting.add(connection);
    this.nextTurn ??= setImmediate(() => {
      this.nextTurn = undefined;
      this.turnBudget = FRAMES_PER_SERVER_TURN;
      const waiting = [...this.waiting];
      this.waiting.clear();
      for (const c of waiting) c.pump();
    });
    return false;
  }

  spend(): void {
    this.turnBudget--;
  }

  forget(connection: Connection): void {
    this.waiting.delete(connection);
  }

  /** A request ended: wakes a drain waiting for the last one. */
  released(): void {
    if (this.drained !== undefined && this.active() === 0) this.drained();
  }

  private active(): number {
    let running = 0;
    for (const connection of this.connections) running += connection.streams.size;
    return running;
  }

  async drain(deadline: number): Promise<DrainReport> {
    if (this.draining) return { running: 0, finished: 0, interrupted: 0 };
    this.draining_ = true;
    const running = this.active();
    if (running > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, deadline);
        this.drained = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.drained = undefined;
    }
    let interrupted = 0;
    for (const connection of this.connections) interrupted += connection.interruptAll();
    this.close();
    return { running, finished: running - interrupted, interrupted };
  }

  close(): void {
    if (this.shut) return;
    this.shut = true;
    this.server.off('upgrade', this.onUpgrade);
    clearInterval(this.heartbeat);
    clearImmediate(this.nextTurn);
    this.nextTurn = undefined;
    this.waiting.clear();
    for (const connection of this.connections) connection.shutDown(CLOSE_CODES.goingAway, 'server shutting down', 'shutdown');
    this.wss.close();
  }
}

const REFUSALS = {
  400: ['BAD_SUBPROTOCOL', 'Bad Request'],
  401: ['UNAUTHORIZED', 'Unauthorized'],
  403: ['FORBIDDEN_ORIGIN', 'Forbidden'],
  503: ['SHUTTING_DOWN', 'Service Unavailable'],
} as const;

/**
 * How a browser is told what it cannot read from an HTTP status. 400 is not here (the
 * handshake cannot select a subprotocol the page did not offer), nor 403 (a foreign page
 * gets no socket at all).
 */
const CLOSE_REFUSALS = {
  401: { code: CLOSE_CODES.unauthorized, prefix: 'unauthorized' },
  503: { code: CLOSE_CODES.tryAgainLater, prefix: 'try again later' },
} as const;

/** How long, ms, a browser refused after the handshake has to answer the close before it is terminated. */
const REFUSAL_CLOSE_TIMEOUT = 1000;

/**
 * Token frames a connection sends before it yields to the event loop. A healthy local
 * socket accepts writes synchronously, so without a budget a fast model would keep the
 * loop to itself until the kernel buffer fills, starving every other connection.
 */
const FRAMES_PER_TURN = 32;

/**
 * Token frames the whole server sends in one event-loop turn. With a thousand busy
 * connections, 32 each would make one turn write 32k frames (~1 s here), delaying every
 * `generate`, `cancel` and pong behind it; past this budget connections wait for the
 * next turn, the ones that waited longest first.
 */
const FRAMES_PER_SERVER_TURN = 1024;

/** One socket: its requests, its bad-frame count, its stall and heartbeat state. */
class Connection {
  readonly streams = new Map<string, Stream>();
  private badInARow = 0;
  private alive = true;
  private ending = false;
  private ended = false;
  private cause: CloseCause = 'client';
  private stallTimer: NodeJS.Timeout | undefined;
  private killTimer: NodeJS.Timeout | undefined;
  private turn = 0;
  private budget = FRAMES_PER_TURN;
  private nextTurn: NodeJS.Immediate | undefined;
  /** Every send completion is a chance that the socket drained: the only wake-up a paused stream needs. */
  private readonly afterSend = (err?: Error | null) => {
    // Node passes null, not undefined, for a write that succeeded.
    if (err == null) this.pump();
  };

  constructor(
    readonly hub: Hub,
    readonly ws: WebSocket,
    readonly number: number,
    readonly tenant: string,
  ) {
    ws.on('message', (data, isBinary) => this.receive(data, isBinary));
    ws.on('pong', () => (this.alive = true));
    ws.on('close', (code) => this.onClose(code));
    // ws closes the socket itself after a protocol error (1009, 1007...); 'close' then cleans up.
    ws.on('error', () => {});
  }

  get limits(): TokenSocketLimits {
    return this.hub.limits;
  }

  timers(): number {
    return (this.stallTimer === undefined ? 0 : 1) + (this.killTimer === undefined ? 0 : 1) + (this.nextTurn === undefined ? 0 : 1);
  }

  /** True while tokens may be decoded for this socket; arms the stall timer when not. */
  writable(): boolean {
    if (this.ending || this.ws.readyState !== wsLib.WebSocket.OPEN) return false;
    if (this.budget <= 0) {
      this.nextTurn ??= setImmediate(() => {
        this.nextTurn = undefined;
        this.budget = FRAMES_PER_TURN;
        this.pump();
      });
      return false;
    }
    if (!this.hub.inTurn(this)) return false;
    if (this.ws.bufferedAmount < this.limits.highWaterMark) return true;
    this.stallTimer ??= setTimeout(() => {
      this.stallTimer = undefined;
      if (this.ws.bufferedAmount >= this.limits.highWaterMark) this.stalled();
    }, this.limits.stallTimeout);
    return false;
  }

  send(frame: ServerFrame): void {
    if (this.ending || this.ws.readyState !== wsLib.WebSocket.OPEN) return;
    // Token frames are paced by demand; error and done frames are not, so a hard cap bounds them.
    if (this.ws.bufferedAmount > this.limits.maxBuffered) return this.stalled();
    if (frame.type === 'token') {
      this.budget--;
      this.hub.spend();
    }
    this.ws.send(JSON.stringify(frame), this.afterSend);
  }

  /** Grants demand to the streams in turn while the socket is under the high-water mark. */
  pump(): void {
    if (this.ending) return;
    if (!this.writable()) return;
    if (this.stallTimer !== undefined) {
      clearTimeout(this.stallTimer);
      this.stallTimer = undefined;
    }
    if (this.streams.size <= 1) {
      // The common case, once per sent frame: no array to rotate.
      for (const stream of this.streams.values()) stream.resume();
      return;
    }
    const streams = [...this.streams.values()];
    const start = this.turn++ % streams.length;
    for (let i = 0; i < streams.length; i++) {
      streams[(start + i) % streams.length]!.resume();
      if (this.ending) return;
    }
  }

  beat(): void {
    if (this.ending) return;
    if (!this.alive) {
      this.cause = 'heartbeat';
      this.abortAll('the client missed a heartbeat');
      this.ws.terminate();
      return;
    }
    this.alive = false;
    if (this.ws.readyState === wsLib.WebSocket.OPEN) this.ws.ping();
  }

  private receive(data: RawData, isBinary: boolean): void {
    if (this.ending) return;
    const parsed = parseClientFrame(isBinary ? '' : textOf(data), isBinary);
    const requestId = parsed.ok ? parsed.message.id : parsed.error.id;
    if (!this.hub.rate.take(String(this.number))) {
      return this.refuse(requestId, 'RATE_LIMITED', `more than ${this.limits.rate.perSecond} frames per second (burst ${this.limits.rate.burst}); frame dropped`);
    }
    if (!parsed.ok) {
      this.hub.counters.badFrames++;
      this.hub.emit({ kind: 'bad-frame', connection: this.number, code: parsed.error.code });
      this.send(parsed.error);
      if (++this.badInARow >= this.limits.maxBadFrames) {
        this.shutDown(CLOSE_CODES.policyViolation, `${this.badInARow} bad frames in a row`, 'bad-frames');
      }
      return;
    }
    this.badInARow = 0;
    const message = parsed.message;
    if (message.type === 'cancel') {
      const stream = this.streams.get(message.id);
      if (stream === undefined) return this.refuse(message.id, 'UNKNOWN_ID', 'no running request has this id (it may have finished already)');
      return stream.cancelByClient();
    }
    this.start(message);
  }

  private start(message: GenerateMessage): void {
    const { id } = message;
    if (this.hub.draining) return this.refuse(id, 'SHUTTING_DOWN', 'the server is shutting down and takes no new requests; retry on another instance');
    if (this.streams.has(id)) return this.refuse(id, 'DUPLICATE_ID', 'a request with this id is still running; ids are free again after done or error');
    if (this.streams.size >= this.limits.maxConcurrent) {
      return this.refuse(id, 'TOO_MANY_REQUESTS', `at most ${this.limits.maxConcurrent} requests may run at once on one connection`);
    }
    const worker = this.hub.worker(message.model);
    if (worker === undefined) return this.refuse(id, 'UNKNOWN_MODEL', 'this server has no model by that name');
    const maxTokens = message.parameters?.max_tokens;
    if (typeof maxTokens === 'number' && maxTokens > this.limits.maxTokens) {
      return this.refuse(id, 'INVALID_OPTIONS', `parameters.max_tokens: at most ${this.limits.maxTokens} on this server`);
    }
    let request: GenerateRequest;
    try {
      const content = message.prompt !== undefined ? { prompt: message.prompt } : { messages: message.messages! };
      request = generateRequest({ ...message.parameters, ...content } as GenerateRequest);
    } catch (err) {
      return this.refuse(id, codeOf(err, 'INVALID_OPTIONS'), messageOf(err));
    }
    if (!this.hub.acquireTenant(this.tenant)) {
      return this.refuse(id, 'TENANT_QUOTA', `tenant has ${this.limits.tenantConcurrent} requests running, its limit`);
    }
    if (!this.hub.tenantRate.take(this.tenant)) {
      this.hub.releaseTenant(this.tenant);
      const { perSecond, burst } = this.limits.tenantRate;
      return this.refuse(id, 'TENANT_QUOTA', `tenant started more than ${perSecond} requests per second (burst ${burst}); retry in ${this.hub.tenantRate.timeUntil(this.tenant, 1)} ms`);
    }
    const tracer = this.hub.tracer;
    // A span per request (continuing the message's traceparent); the element's trace continues the span.
    const otel = genAiSpan({ ...(tracer && { tracer }), model: worker.name, params: request, ...(message.traceparent !== undefined && { traceparent: message.traceparent }) });
    const traceparent = otel.traceparent ?? message.traceparent;
    const seq = this.hub.seq++;
    const sampled = this.hub.sample(seq) || (message.traceparent !== undefined && parseTraceparent(message.traceparent)?.sampled === true);
    const trace = traced(request, { seq, sampled, ...(traceparent !== undefined && { traceparent }) }).trace;
    const stream = new Stream(this, id, message.policy ?? 'pause', trace, otel);
    this.streams.set(id, stream);
    this.hub.counters.started++;
    stream.start(worker, request);
  }

  /** Called by a stream that ended, however it ended. */
  release(stream: Stream): void {
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    this.hub.releaseTenant(this.tenant);
    this.hub.released();
  }

  /** Ends every running request with a `SHUTDOWN` error frame (the drain's deadline passed); returns how many. */
  interruptAll(): number {
    const streams = [...this.streams.values()];
    for (const stream of streams) stream.interrupt();
    return streams.length;
  }

  refuse(id: string | undefined, code: RequestErrorCode | (string & {}), message: string): void {
    this.hub.emit({ kind: 'refused', connection: this.number, code });
    this.send(errorFrame(id, code, message));
  }

  private stalled(): void {
    this.shutDown(CLOSE_CODES.slowConsumer, 'slow consumer: buffered bytes did not drain', 'stalled');
  }

  /** Starts closing: requests are cancelled at once; the close frame waits behind buffered data, so a kill timer bounds the wait. */
  shutDown(code: number, reason: string, cause: CloseCause): void {
    if (this.ending) return;
    this.cause = cause;
    this.abortAll(reason);
    this.ending = true;
    this.ws.close(code, reason);
    this.killTimer = setTimeout(() => {
      this.killTimer = undefined;
      this.ws.terminate();
    }, this.limits.stallTimeout);
  }

  private abortAll(reason: string): void {
    for (const stream of [...this.streams.values()]) stream.abort(reason);
  }

  private onClose(code: number): void {
    if (this.ended) return;
    this.ended = true;
    this.ending = true;
    this.abortAll('the connection closed');
    clearTimeout(this.stallTimer);
    clearTimeout(this.killTimer);
    clearImmediate(this.nextTurn);
    this.stallTimer = this.killTimer = this.nextTurn = undefined;
    this.hub.forget(this);
    this.hub.connections.delete(this);
    this.hub.emit({ kind: 'closed', connection: this.number, tenant: this.tenant, code, cause: this.cause });
  }
}

/**
 * One request: its token Flow subscribed with explicit demand, and what is owed to the
 * client. `pause` asks for one token at a time while the socket is writable; `conflate`
 * keeps asking while its pending text is under `conflateLimit` and sends the pending
 * text as one frame when the socket is writable again.
 */
class Stream {
  private subscription: DemandSubscription | undefined;
  private readonly controller = new AbortController();
  private seq = 0;
  private pending = '';
  private pendingTokens = 0;
  private outputTokens = 0;
  private report: GenerationDone | undefined;
  private finished = false;
  private model = '';
  private readonly startedAt = performance.now();
  private readonly startedEpoch = Date.now();

  constructor(
    private readonly connection: Connection,
    readonly id: string,
    private readonly policy: 'pause' | 'conflate',
    private readonly trace: TraceContext,
    private readonly otel: GenAiSpan,
  ) {}

  start(worker: TokenWorker, request: GenerateRequest): void {
    this.model = worker.name;
    try {
      const flow = worker.generate(request, { signal: this.controller.signal, trace: this.trace, stage: worker.name, onDone: (done) => (this.report = done) });
      this.subscription = subscribeWithDemand(flow, {
        next: (token) => this.onToken(token),
        error: (err: unknown) => this.onError(err),
        complete: () => this.onComplete(),
      });
    } catch (err) {
      return this.onError(err);
    }
    this.resume();
  }

  /** Asks for the next token if the policy has room; flushes conflated text when the socket can take it. */
  resume(): void {
    const subscription = this.subscription;
    if (this.finished || subscription === undefined) return;
    if (this.pending.length > 0 && this.connection.writable()) this.flush();
    if (subscription.outstanding > 0 || this.finished) return;
    const room = this.policy === 'pause' ? this.connection.writable() : this.pending.length < this.connection.limits.conflateLimit;
    if (room) subscription.request(1);
  }

  private onToken(token: Token): void {
    if (this.finished) return;
    this.outputTokens++;
    if (this.policy === 'conflate') {
      this.pending += token.text;
      this.pendingTokens++;
    } else {
      this.sendToken(token.text, 1);
    }
    this.resume();
  }

  private flush(): void {
    const text = this.pending;
    const tokens = this.pendingTokens;
    this.pending = '';
    this.pendingTokens = 0;
    this.sendToken(text, tokens);
  }

  private sendToken(text: string, tokens: number): void {
    this.connection.send({ type: 'token', id: this.id, seq: this.seq++, text, tokens });
  }

  private onComplete(): void {
    if (this.finished) return;
    // The conflated tail is bounded by `conflateLimit`, so it goes out without waiting for drain.
    if (this.pending.length > 0) this.flush();
    this.end();
    this.connection.hub.counters.completed++;
    this.sendDone(this.report?.finishReason ?? 'stop');
    this.observe(undefined);
  }

  /** Feeds the request's trace and generation report to the metrics, and ends its spans. */
  private observe(error: unknown): void {
    const hub = this.connection.hub;
    const tracer = hub.tracer;
    endGenAiSpan(this.otel.span, { ...(this.report && { done: this.report }), ...(error !== undefined && { error }), responseId: this.id, responseModel: this.model, trace: this.trace });
    recordStageSpans(this.trace, this.otel.context, { ...(tracer && { tracer }), startTime: this.startedEpoch });
    if (hub.metrics === undefined) return;
    hub.metrics.observeTrace(this.trace);
    if (this.report !== undefined) hub.metrics.observeGeneration(this.model, this.report, (performance.now() - this.startedAt) / 1000, error === undefined ? undefined : errorType(error));
  }

  private onError(err: unknown): void {
    if (this.finished) return;
    this.end();
    this.connection.hub.counters.failed++;
    this.connection.refuse(this.id, codeOf(err, 'GENERATION_FAILED'), messageOf(err));
    this.observe(err);
  }

  /** The drain deadline passed: the model stops and the client is told why, so nothing ends silently. */
  interrupt(): void {
    if (this.finished) return;
    this.end();
    this.connection.hub.counters.interrupted++;
    this.subscription?.cancel();
    const error = new SluiceError('SHUTDOWN', 'Request interrupted: the server shut down.');
    this.controller.abort(error);
    this.connection.refuse(this.id, 'SHUTDOWN', 'the server shut down before this request finished; retry on another instance');
    this.observe(error);
  }

  /** The client's `cancel`: the model stops, and `done` (finish_reason `abort`) confirms it. */
  cancelByClient(): void {
    if (this.finished) return;
    this.abort('the client cancelled the request');
    this.sendDone('abort');
  }

  /** Unsubscribes the pipeline and aborts the model's work; nothing more is sent for this request. */
  abort(reason: string): void {
    if (this.finished) return;
    this.end();
    this.connection.hub.counters.cancelled++;
    // Unsubscribe first: the worker then reports `abort` through onDone rather than erroring the Flow.
    this.subscription?.cancel();
    const error = new SluiceError('ABORTED', `Request aborted: ${reason}.`);
    this.controller.abort(error);
    this.observe(error);
  }

  private end(): void {
    this.finished = true;
    this.pending = '';
    this.connection.release(this);
  }

  private sendDone(finishReason: 'stop' | 'length' | 'abort'): void {
    const usage = this.report?.usage ?? { inputTokens: 0, outputTokens: this.outputTokens };
    this.connection.send({
      type: 'done',
      id: this.id,
      finish_reason: finishReason,
      usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
      traceparent: traceparentOf(this.otel.span) ?? this.trace.traceparent,
    });
  }
}

function errorFrame(id: string | undefined, code: string, message: string): ErrorFrame {
  return id === undefined ? { type: 'error', code, message } : { type: 'error', id, code, message };
}

/** A `SluiceError`'s code, else `fallback`. */
function codeOf(err: unknown, fallback: string): string {
  return err instanceof SluiceError ? err.code : fallback;
}

/**
 * Only sluice's own messages are passed on: anything else may carry internals (paths,
 * hosts, keys). A guard's block says only that: its score and thresholds are the operator's.
 */
function messageOf(err: unknown): string {
  if (!(err instanceof SluiceError)) return 'the generation failed';
  return err.code === 'GUARD_BLOCKED' ? 'the request was blocked by the content policy' : err.message;
}

function textOf(data: RawData): string {
  if (Array.isArray(data)) return Buffer.concat(data).toString('utf8');
  return Buffer.isBuffer(data) ? data.toString('utf8') : Buffer.from(data).toString('utf8');
}

function protocolsOf(header: string | undefined): string[] {
  if (header === undefined) return [];
  return header
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p.length > 0);
}

