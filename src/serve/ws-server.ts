/**
 * The WebSocket token server: `attachTokenSocket(httpServer, options)` takes over the
 * `upgrade` requests of a `node:http` server and streams generations over the
 * `sluice.v1` protocol (see `protocol.ts`). This module is its public face; the parts
 * live in `ws/`, one concern a file:
 *
 * - `ws/options.ts` — options and limits, their defaults and validation;
 * - `ws/admission.ts` — origin, bearer token, subprotocol and drain checks on upgrade, and refusals;
 * - `ws/quotas.ts` — frame rate per connection, request concurrency and rate per tenant;
 * - `ws/fair-share.ts` — token frames per connection and per server in one event-loop turn;
 * - `ws/connection.ts` — one socket: frames, heartbeat, stall detection;
 * - `ws/stream.ts` — one request: its token Flow bridged to the socket with demand, and cancellation;
 * - `ws/hub.ts` — the registry of connections, stats, drain and close;
 * - `ws/events.ts`, `ws/errors.ts` — what is reported to logs and told to clients.
 *
 * Each connection owns its requests (multiplexed by `id`); each request is its model's
 * token `Flow` subscribed with explicit demand, and demand is granted only while the
 * socket's `bufferedAmount` is under the high-water mark, so a client that does not
 * read stops its model from decoding instead of filling server memory.
 *
 * Security is checked before a connection exists (`ws/admission.ts`): origin allow-list
 * (403), bearer token (401), subprotocol `sluice.v1` (400), not draining (503); a browser
 * is refused after the handshake with close 4401 or 1013 instead of 401 or 503, since its
 * WebSocket API cannot see an HTTP status.
 *
 * After admission the server greets first, before any other frame: one `hello`
 * (`HelloFrame`) with the connection's number, its tenant, the model names and the
 * limits a client must stay within — a small `maxPayload`, per-connection concurrency
 * and message-rate limits, per-tenant concurrency and request-rate quotas, the
 * `maxTokens` cap, and the ping/pong heartbeat's interval.
 */
import type { Server as HttpServer } from 'node:http';
import type { SocketClient, TokenSocketStats } from './socket-stats.js';
import { parseTokenSocketOptions, type TokenSocketOptions } from './ws/options.js';
import { Hub, type DrainReport } from './ws/hub.js';

export type { RefusalStatus, TokenSocketStats, SocketClient } from './socket-stats.js';
export type { TokenWorker, Principal, Authenticate, TokenSocketLimits, TokenSocketOptions } from './ws/options.js';
export type { TokenSocketEvent, RefusalCloseCode, CloseCause } from './ws/events.js';
export type { DrainReport } from './ws/hub.js';

/** The handle `attachTokenSocket` returns. */
export interface TokenSocket {
  /** Counters of the socket server: connections, requests, refusals. */
  stats(): TokenSocketStats;
  /** Every connection now: buffered bytes and stall state (the inspector's list). */
  clients(): SocketClient[];
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
  const { config, limits } = parseTokenSocketOptions(options);
  const hub = new Hub(server, config, limits);
  return {
    stats: () => hub.stats(),
    clients: () => hub.clients(),
    close: () => hub.close(),
    drain: (deadline) => hub.drain(deadline),
    get draining() {
      return hub.draining;
    },
  };
}
