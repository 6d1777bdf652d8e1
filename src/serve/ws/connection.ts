/**
 * One admitted socket: the frames it reads and writes, the requests it multiplexes, its
 * heartbeat, and stall detection. Kept apart from the hub (which holds the connections)
 * and from the stream bridge (one per request on it).
 */
import type { Duplex } from 'node:stream';
import type { WebSocket, RawData } from 'ws';
import { wsPeer } from '../../core/peers.js';
import { generateRequest, type GenerateRequest } from '../../ai/inference/worker.js';
import type { RequestTelemetry } from '../telemetry.js';
import { CLOSE_CODES, parseClientFrame, type GenerateMessage, type RequestErrorCode, type ServerFrame } from '../protocol.js';
import type { CloseCause, Counters, TokenSocketEvent } from './events.js';
import type { SocketClient } from '../socket-stats.js';
import type { TokenSocketLimits, TokenWorker } from './options.js';
import type { Quotas } from './quotas.js';
import type { RequestLog } from '../request-log.js';
import { WriteBudget, type ServerBudget } from './fair-share.js';
import type { TokenBucket } from '../../core/token-bucket.js';
import { Stream, type StreamHost } from './stream.js';
import { StreamTable } from './stream-table.js';
import { codeOf, errorFrame, messageOf } from './errors.js';

const wsLib = wsPeer();

/** What a connection needs of the server that holds it. */
export interface ConnectionHub {
  readonly limits: TokenSocketLimits;
  readonly counters: Counters;
  readonly quotas: Quotas;
  readonly telemetry: RequestTelemetry;
  readonly requestLog: RequestLog | undefined;
  /** Requests get a `<connection>:<id>` name (the request log and the inspector read it). */
  readonly namesRequests: boolean;
  readonly budget: ServerBudget;
  /** True once the server drains or closed: it takes no new requests. */
  readonly draining: boolean;
  emit(event: TokenSocketEvent): void;
  /** The worker a message's `model` names; the default when it names none. */
  worker(model: string | undefined): TokenWorker | undefined;
  /** A request ended: wakes a drain waiting for the last one. */
  released(): void;
  /** The connection closed: the hub forgets it. */
  forget(connection: Connection): void;
}

/** Each socket's connection, for the listeners every connection shares. */
const sockets = new WeakMap<WebSocket, Connection>();

function onMessage(this: WebSocket, data: RawData, isBinary: boolean): void {
  sockets.get(this)?.receive(data, isBinary);
}

function onPong(this: WebSocket): void {
  sockets.get(this)?.ponged();
}

function onSocketClose(this: WebSocket, code: number): void {
  sockets.get(this)?.onClose(code);
}

function ignore(): void {}

/** The largest WebSocket frame header a server sends (unmasked, 64-bit length). */
const MAX_HEADER = 10;

/** How long, ms, a stalled client's close frame may take to get out before the connection is cut. */
const STALL_CLOSE_GRACE = 1000;

/** One socket: its requests, its bad-frame count, its stall and heartbeat state. */
export class Connection implements StreamHost {
  readonly streams = new StreamTable<Stream>();
  private badInARow = 0;
  private alive = true;
  private ending = false;
  private ended = false;
  private cause: CloseCause = 'client';
  private stallTimer: NodeJS.Timeout | undefined;
  /** When it went above the high-water mark (performance.now()), for the inspector. */
  private stalledSince: number | undefined;
  private killTimer: NodeJS.Timeout | undefined;
  private turn = 0;
  private readonly budget: WriteBudget;
  /** Frames this socket may send (`limits.rate`). */
  private readonly frames: TokenBucket;
  /** The completion of a frame sent at or above the high-water mark is the wake-up a paused stream needs (see `send`). Bound, not an arrow: no context to keep. */
  private readonly afterSend: (err?: Error | null) => void = this.sent.bind(this);

  constructor(
    readonly hub: ConnectionHub,
    readonly ws: WebSocket,
    readonly number: number,
    readonly tenant: string,
    /** The socket under `ws`, corked while a turn's frames are written so they leave in one write. */
    private readonly socket?: Duplex,
  ) {
    this.budget = new WriteBudget(hub.budget, this);
    this.frames = hub.quotas.frameBucket();
    // The listeners are shared by every connection and find theirs by socket: closures per connection lived as long as it.
    sockets.set(ws, this);
    ws.on('message', onMessage);
    ws.on('pong', onPong);
    ws.on('close', onSocketClose);
    // ws closes the socket itself after a protocol error (1009, 1007...); 'close' then cleans up.
    ws.on('error', ignore);
  }

  private sent(err?: Error | null): void {
    // Node passes null, not undefined, for a write that succeeded.
    if (err == null) this.pump();
  }

  get limits(): TokenSocketLimits {
    return this.hub.limits;
  }

  get counters(): Counters {
    return this.hub.counters;
  }

  timers(): number {
    return (this.stallTimer === undefined ? 0 : 1) + (this.killTimer === undefined ? 0 : 1) + this.budget.timers();
  }

  /** True while tokens may be decoded for this socket; arms the stall timer when not. */
  writable(): boolean {
    if (this.ending || this.ws.readyState !== wsLib.WebSocket.OPEN) return false;
    if (!this.budget.mayWrite()) return false;
    if (this.ws.bufferedAmount < this.limits.highWaterMark) return true;
    this.stalledSince ??= performance.now();
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
    if (frame.type === 'token') this.budget.spend();
    const data = JSON.stringify(frame);
    // Writes complete in order, so only a frame that may leave the socket at or above the high-water mark needs its
    // completion to wake the streams; a callback on every frame cost Node's stream a closure, an array and a tick each.
    if (this.ws.bufferedAmount + 3 * data.length + MAX_HEADER >= this.limits.highWaterMark) this.ws.send(data, this.afterSend);
    else this.ws.send(data);
  }

  /** Grants demand to the streams in turn while the socket is under the high-water mark. */
  pump(): void {
    if (this.ending) return;
    if (!this.writable()) return;
    if (this.stallTimer !== undefined) {
      clearTimeout(this.stallTimer);
      this.stallTimer = undefined;
    }
    this.stalledSince = undefined;
    // The frames the streams send now leave in one write when the socket is uncorked.
    this.socket?.cork();
    try {
      if (this.streams.size <= 1) {
        // The common case: no array to rotate.
        this.streams.single()?.resume();
        return;
      }
      const streams = this.streams.values();
      const start = this.turn++ % streams.length;
      for (let i = 0; i < streams.length; i++) {
        streams[(start + i) % streams.length]!.resume();
        if (this.ending) return;
      }
    } finally {
      this.socket?.uncork();
    }
  }

  describe(): SocketClient {
    const buffered = this.ws.bufferedAmount;
    const stalled = this.stalledSince !== undefined && buffered >= this.limits.highWaterMark;
    return {
      connection: this.number,
      tenant: this.tenant,
      requests: this.streams.size,
      buffered,
      stalledMs: stalled ? Math.round(performance.now() - this.stalledSince!) : null,
      closing: this.ending,
    };
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

  /** @internal A frame from the socket. */
  receive(data: RawData, isBinary: boolean): void {
    if (this.ending) return;
    const parsed = parseClientFrame(isBinary ? '' : textOf(data), isBinary);
    const requestId = parsed.ok ? parsed.message.id : parsed.error.id;
    if (!this.frames.take()) {
      return this.refuse(
        requestId,
        'RATE_LIMITED',
        `more than ${this.limits.rate.perSecond} frames per second (burst ${this.limits.rate.burst}); frame dropped`,
      );
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
      // `Object.assign`, not a spread: V8 (Node 20) makes every `{ ...object, key }` in the old generation, and zod's parse of this one went there too (~450 B a request).
      request = generateRequest(Object.assign({}, message.parameters, content) as GenerateRequest);
    } catch (err) {
      return this.refuse(id, codeOf(err, 'INVALID_OPTIONS'), messageOf(err));
    }
    const overQuota = this.hub.quotas.acquire(this.tenant);
    if (overQuota !== undefined) return this.refuse(id, 'TENANT_QUOTA', overQuota);
    const telemetry = this.hub.telemetry.begin({
      model: worker.name,
      request,
      traceparent: message.traceparent,
      transport: 'ws',
      tenant: this.tenant,
      // Only for the request log and the inspector: a string per request that would live as long as the request.
      logId: this.hub.namesRequests ? `${this.number}:${id}` : undefined,
    });
    const stream = new Stream(this, id, message.policy ?? 'pause', telemetry);
    this.streams.add(stream);
    this.hub.counters.started++;
    // The inspector's cancel is the client's own: `done` with finish_reason `abort`.
    telemetry.cancelWith(() => stream.cancelByClient());
    // Its first frames leave in one write, as a turn's do in `pump`.
    this.socket?.cork();
    try {
      stream.start(worker, request);
    } finally {
      this.socket?.uncork();
    }
  }

  release(stream: Stream): void {
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    this.hub.quotas.release(this.tenant);
    this.hub.released();
  }

  /** Ends every running request with a `SHUTDOWN` error frame (the drain's deadline passed); returns how many. */
  interruptAll(): number {
    const streams = this.streams.values();
    for (const stream of streams) stream.interrupt();
    return streams.length;
  }

  refuse(id: string | undefined, code: RequestErrorCode | (string & {}), message: string, retryAfter?: number): void {
    this.hub.emit({ kind: 'refused', connection: this.number, code });
    this.hub.requestLog?.({
      transport: 'ws',
      id: `${this.number}:${id ?? '-'}`,
      tenant: this.tenant,
      outcome: 'refused',
      durationMs: 0,
      error: { code, message },
    });
    this.send(errorFrame(id, code, message, retryAfter));
  }

  private stalled(): void {
    // The close frame queues behind data the client is not reading: it gets a short grace, not another stallTimeout.
    this.shutDown(CLOSE_CODES.slowConsumer, 'slow consumer: buffered bytes did not drain', 'stalled', Math.min(STALL_CLOSE_GRACE, this.limits.stallTimeout));
  }

  /**
   * Starts closing: requests are cancelled at once; the close frame waits behind buffered data,
   * so a kill timer (`grace`, default `stallTimeout`) bounds the wait.
   */
  shutDown(code: number, reason: string, cause: CloseCause, grace = this.limits.stallTimeout): void {
    if (this.ending) return;
    this.cause = cause;
    this.abortAll(reason);
    this.ending = true;
    this.ws.close(code, reason);
    this.killTimer = setTimeout(() => {
      this.killTimer = undefined;
      this.ws.terminate();
    }, grace);
  }

  private abortAll(reason: string): void {
    for (const stream of this.streams.values()) stream.abort(reason);
  }

  /** @internal The socket answered a ping. */
  ponged(): void {
    this.alive = true;
  }

  /** @internal The socket closed. */
  onClose(code: number): void {
    if (this.ended) return;
    this.ended = true;
    this.ending = true;
    this.abortAll('the connection closed');
    clearTimeout(this.stallTimer);
    clearTimeout(this.killTimer);
    this.stallTimer = this.killTimer = undefined;
    this.budget.close();
    this.hub.forget(this);
    this.hub.emit({ kind: 'closed', connection: this.number, tenant: this.tenant, code, cause: this.cause });
  }
}

function textOf(data: RawData): string {
  if (Array.isArray(data)) return Buffer.concat(data).toString('utf8');
  return Buffer.isBuffer(data) ? data.toString('utf8') : Buffer.from(data).toString('utf8');
}
