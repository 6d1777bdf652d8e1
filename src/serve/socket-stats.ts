/** The counters a token socket keeps: read by the server's `stats()` and exported by `SluiceMetrics`. */

/** The HTTP status of a refused upgrade: bad subprotocol, bad token, foreign origin, shutting down. */
export type RefusalStatus = 400 | 401 | 403 | 503;

/** One WebSocket connection now, as the inspector lists it. */
export interface SocketClient {
  readonly connection: number;
  readonly tenant: string;
  /** Requests running on it. */
  readonly requests: number;
  /** Bytes waiting in its send buffer. */
  readonly buffered: number;
  /** How long, ms, it has been above the high-water mark (no tokens decoded for it); null when it is not. */
  readonly stalledMs: number | null;
  /** True once it is closing (a stalled client's 4008, a shutdown). */
  readonly closing: boolean;
}

/** Counters for tests, health checks and metrics. */
export interface TokenSocketStats {
  readonly connections: number;
  /** Requests subscribed to a model now. */
  readonly activeRequests: number;
  /** Bytes waiting in the sockets' send buffers now, all connections together. */
  readonly buffered: number;
  /** Stall and close timers armed now, refused browsers' included (the heartbeat interval is not counted). */
  readonly timers: number;
  /** Requests running per tenant (tenants with none are absent). */
  readonly tenants: Readonly<Record<string, number>>;
  readonly started: number;
  readonly completed: number;
  readonly cancelled: number;
  readonly failed: number;
  /** Requests ended by `drain()` at its deadline, with a `SHUTDOWN` error frame. */
  readonly interrupted: number;
  readonly badFrames: number;
  /** Upgrades refused, by HTTP status; a browser refused with 4401 or 1013 counts under 401 or 503. */
  readonly upgradesRejected: Readonly<Record<RefusalStatus, number>>;
}
