/**
 * Admission: which upgrade requests become connections, checked before a connection
 * exists, and how a refusal is told. Kept apart because it runs before any connection state.
 *
 * The checks, in this order:
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
 */
import type { IncomingMessage, Server as HttpServer } from 'node:http';
import type { Duplex } from 'node:stream';
import type { WebSocketServer, WebSocket } from 'ws';
import { wsPeer } from '../../core/peers.js';
import { BEARER_PROTOCOL_PREFIX, CLOSE_CODES, SUBPROTOCOL, bearerOf, pathOf } from '../protocol.js';
import type { RefusalStatus } from '../socket-stats.js';
import type { RefusalCloseCode, TokenSocketEvent } from './events.js';
import type { Principal, TokenSocketConfig } from './options.js';

const wsLib = wsPeer();

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

/** What admission needs of the server it admits to. */
export interface AdmissionHost {
  /** True once `drain()` began: upgrades are refused with 503. */
  draining(): boolean;
  /** True once the server closed: upgrades are dropped. */
  closed(): boolean;
  emit(event: TokenSocketEvent): void;
  /** An admitted socket (and the TCP socket under it), with the tenant its token belongs to; undefined without authentication (a tenant per connection). */
  accept(ws: WebSocket, tenant: string | undefined, socket: Duplex): void;
}

/** Takes over `server`'s upgrade requests (on `config.path`, if given) until `close()`. */
export class Admission {
  private readonly wss: WebSocketServer;
  private readonly onUpgrade: (request: IncomingMessage, socket: Duplex, head: Buffer) => void;
  private readonly rejected: Record<RefusalStatus, number> = { 400: 0, 401: 0, 403: 0, 503: 0 };
  /** Browsers refused after the handshake, each with the timer that terminates it if its close does not complete. */
  private readonly refusing = new Map<WebSocket, NodeJS.Timeout>();

  constructor(
    private readonly server: HttpServer,
    private readonly config: Pick<TokenSocketConfig, 'path' | 'origins' | 'authenticate'>,
    maxPayload: number,
    private readonly host: AdmissionHost,
  ) {
    this.wss = new wsLib.WebSocketServer({
      noServer: true,
      maxPayload,
      perMessageDeflate: false,
      // Only the versioned protocol is ever selected: a `bearer.*` entry must never be echoed back.
      handleProtocols: (protocols) => (protocols.has(SUBPROTOCOL) ? SUBPROTOCOL : false),
    });
    // A handshake ws itself finds malformed (key, version, method) is refused, counted and reported like ours.
    this.wss.on('wsClientError', (error: Error, socket: Duplex, request: IncomingMessage) => {
      this.refuse(request, socket, Buffer.alloc(0), 400, `invalid handshake: ${error.message}`);
    });
    this.onUpgrade = (request, socket, head) => {
      if (this.config.path !== undefined && pathOf(request.url) !== this.config.path) return;
      void this.admit(request, socket, head);
    };
    server.on('upgrade', this.onUpgrade);
  }

  /** Upgrades refused so far, by HTTP status. */
  refusals(): Record<RefusalStatus, number> {
    return { ...this.rejected };
  }

  /** Close timers of refused browsers armed now. */
  timers(): number {
    return this.refusing.size;
  }

  /** Stops taking upgrades. */
  /** Stops admitting. After a drain upgrades keep getting 503 (until the HTTP server closes), so late clients learn to retry elsewhere. */
  close(): void {
    if (!this.host.draining()) this.server.off('upgrade', this.onUpgrade);
    this.wss.close();
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
    // Without authentication each connection is a tenant of its own: one client cannot spend another's quota.
    const open = this.config.authenticate === undefined;
    let principal: Principal | undefined;
    if (this.config.authenticate !== undefined && token !== undefined && token.length > 0) {
      try {
        principal = await this.config.authenticate(token, request);
      } catch {
        principal = undefined;
      }
    }
    if (!open && (principal === undefined || typeof principal.tenant !== 'string'))
      return this.refuse(request, socket, head, 401, 'missing or invalid bearer token');
    if (!offered.includes(SUBPROTOCOL)) return this.refuse(request, socket, head, 400, `subprotocol ${SUBPROTOCOL} required`);
    if (this.host.draining()) return this.refuse(request, socket, head, 503, 'the server is shutting down');
    if (this.host.closed() || socket.destroyed) return void socket.destroy();
    const tenant = principal?.tenant;
    this.wss.handleUpgrade(request, socket, head, (ws) => {
      socket.off('error', ignore);
      if (this.host.closed()) return void ws.terminate();
      this.host.accept(ws, tenant, socket);
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
    const byClose =
      close !== undefined &&
      request.headers.origin !== undefined &&
      !this.host.closed() &&
      !socket.destroyed &&
      protocolsOf(request.headers['sec-websocket-protocol']).includes(SUBPROTOCOL);
    if (byClose) {
      this.host.emit({ kind: 'upgrade-rejected', status, reason, closeCode: close.code });
      return this.refuseAfterHandshake(request, socket, head, close.code, `${close.prefix}: ${reason}`);
    }
    this.host.emit({ kind: 'upgrade-rejected', status, reason });
    if (socket.destroyed) return;
    const [code, title] = REFUSALS[status];
    const body = JSON.stringify({ error: { code, message: reason } });
    const headers = [
      `HTTP/1.1 ${status} ${title}`,
      'Connection: close',
      'Content-Type: application/json',
      `Content-Length: ${Buffer.byteLength(body)}`,
      ...(status === 401 ? ['WWW-Authenticate: Bearer'] : []),
      // 503 is only the drain's: the next attempt will reach another instance.
      ...(status === 503 ? ['Retry-After: 1'] : []),
    ];
    // Destroy only once the answer is flushed, or the client may see a reset instead of the status.
    socket.once('finish', () => socket.destroy());
    socket.end(`${headers.join('\r\n')}\r\n\r\n${body}`);
  }

  /**
   * Completes the handshake and closes at once with `code`. The socket never becomes a
   * connection: no message listener (frames are read and dropped), no tenant, no
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
}

function protocolsOf(header: string | undefined): string[] {
  if (header === undefined) return [];
  return header
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p.length > 0);
}
