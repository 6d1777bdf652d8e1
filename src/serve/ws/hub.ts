/**
 * The hub: what a server's connections share — their registry and numbering, the
 * workers, quotas, write budget, telemetry and heartbeat — and the server's lifecycle
 * (stats, drain, close). Kept apart from admission (before a connection) and the
 * connection itself (one socket).
 */
import type { Server as HttpServer } from 'node:http';
import type { Duplex } from 'node:stream';
import type { WebSocket } from 'ws';
import { CLOSE_CODES, SUBPROTOCOL, type HelloLimits } from '../protocol.js';
import type { SocketClient, TokenSocketStats } from '../socket-stats.js';
import { RequestTelemetry, telemetryOptionsOf } from '../telemetry.js';
import { eventSink, type Counters, type TokenSocketEvent } from './events.js';
import type { TokenSocketConfig, TokenSocketLimits, TokenWorker } from './options.js';
import { Admission } from './admission.js';
import { Quotas } from './quotas.js';
import type { RequestLog } from '../request-log.js';
import { ServerBudget } from './fair-share.js';
import { Connection, type ConnectionHub } from './connection.js';

/** What `drain()` reports. */
export interface DrainReport {
  /** Requests running when the drain began. */
  readonly running: number;
  /** Of those, how many ended on their own (done, error or client cancel) before the deadline. */
  readonly finished: number;
  /** Of those, how many were cut off at the deadline with a `SHUTDOWN` error frame. */
  readonly interrupted: number;
}

export class Hub implements ConnectionHub {
  readonly connections = new Set<Connection>();
  readonly counters: Counters = { started: 0, completed: 0, cancelled: 0, failed: 0, interrupted: 0, badFrames: 0 };
  readonly quotas: Quotas;
  readonly budget = new ServerBudget();
  readonly telemetry: RequestTelemetry;
  readonly requestLog: RequestLog | undefined;
  /** Requests are named `<connection>:<id>`: for the request log and the inspector's list, which read it. */
  readonly namesRequests: boolean;
  readonly emit: (event: TokenSocketEvent) => void;
  private readonly admission: Admission;
  private readonly heartbeat: NodeJS.Timeout;
  private readonly workers: ReadonlyMap<string, TokenWorker>;
  /** What every connection's `hello` announces: the model names (the default first) and the client-facing limits. */
  private readonly models: readonly string[];
  private readonly clientLimits: HelloLimits;
  private numbering = 0;
  private shut = false;
  private drainStarted = false;
  private drained: (() => void) | undefined;
  private drainReport: Promise<DrainReport> | undefined;

  constructor(
    server: HttpServer,
    config: TokenSocketConfig,
    readonly limits: TokenSocketLimits,
  ) {
    this.workers = new Map(config.worker !== undefined ? [[config.worker.name, config.worker]] : Object.entries(config.workers ?? {}));
    // Map order is the workers' order, so the first name is the default `worker()` picks.
    this.models = [...this.workers.keys()];
    this.quotas = new Quotas(limits, config.tenantQuotas);
    // The hello tells the tenant limits in force: shared quotas bring their own.
    const { tenantConcurrent, tenantRate } = this.quotas.tenants.limits;
    const { maxTokens, maxConcurrent, rate, maxPayload, heartbeatInterval } = limits;
    this.clientLimits = { maxTokens, maxConcurrent, rate, tenantConcurrent, tenantRate, maxPayload, heartbeatInterval };
    this.requestLog = config.requestLog;
    this.namesRequests = config.requestLog !== undefined || config.requests !== undefined;
    this.telemetry = new RequestTelemetry(telemetryOptionsOf(config));
    this.emit = eventSink(config.onEvent);
    this.admission = new Admission(server, config, maxPayload, {
      // 503 from the drain's start on, even once closed; a server closed without a drain drops upgrades instead.
      draining: () => this.drainStarted,
      closed: () => this.shut,
      emit: this.emit,
      accept: (ws, tenant, socket) => this.accept(ws, tenant, socket),
    });
    this.heartbeat = setInterval(() => {
      for (const connection of this.connections) connection.beat();
    }, heartbeatInterval);
    this.heartbeat.unref();
    config.metrics?.registerSocket(config.name, () => this.stats());
  }

  get draining(): boolean {
    return this.drainStarted || this.shut;
  }

  worker(model: string | undefined): TokenWorker | undefined {
    if (model === undefined) return this.workers.values().next().value;
    return this.workers.get(model);
  }

  private accept(ws: WebSocket, authenticated: string | undefined, socket: Duplex): void {
    const number = ++this.numbering;
    const tenant = authenticated ?? `anonymous-${number}`;
    const connection = new Connection(this, ws, number, tenant, socket);
    this.connections.add(connection);
    // The greeting goes first: no frame of this connection can be sent before it.
    connection.send({ type: 'hello', protocol: SUBPROTOCOL, connection: connection.number, tenant, models: this.models, limits: this.clientLimits });
    this.emit({ kind: 'connected', connection: connection.number, tenant });
  }

  forget(connection: Connection): void {
    this.connections.delete(connection);
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
    timers += this.admission.timers();
    return {
      connections: this.connections.size,
      activeRequests,
      buffered,
      timers,
      tenants: this.quotas.tenants.tenants(),
      ...this.counters,
      upgradesRejected: this.admission.refusals(),
    };
  }

  /** Every connection now: its buffered bytes and whether it is stalled, for the inspector. */
  clients(): SocketClient[] {
    return [...this.connections].map((connection) => connection.describe());
  }

  released(): void {
    if (this.drained !== undefined && this.active() === 0) this.drained();
  }

  private active(): number {
    let running = 0;
    for (const connection of this.connections) running += connection.streams.size;
    return running;
  }

  /** A second call while a drain runs gets the same report; after a close without a drain, an empty one. */
  drain(deadline: number): Promise<DrainReport> {
    if (this.drainReport !== undefined) return this.drainReport;
    if (this.shut) return Promise.resolve({ running: 0, finished: 0, interrupted: 0 });
    this.drainReport = this.runDrain(deadline);
    return this.drainReport;
  }

  private async runDrain(deadline: number): Promise<DrainReport> {
    this.drainStarted = true;
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
    clearInterval(this.heartbeat);
    this.budget.close();
    for (const connection of this.connections) connection.shutDown(CLOSE_CODES.goingAway, 'server shutting down', 'shutdown');
    this.admission.close();
  }
}
