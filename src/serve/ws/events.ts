/** What a token socket reports as it runs (events for logs, the counters `stats()` reads): apart, so every part reports without importing the hub. */
import type { CLOSE_CODES, ProtocolErrorCode, RequestErrorCode } from '../protocol.js';
import type { RefusalStatus, TokenSocketStats } from '../socket-stats.js';

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

/** The request and frame counters, as the connections and their requests bump them. */
export type Counters = { -readonly [K in 'started' | 'completed' | 'cancelled' | 'failed' | 'interrupted' | 'badFrames']: TokenSocketStats[K] };

/** The `onEvent` hook, called so that a throw stays inside it. */
export function eventSink(onEvent: ((event: TokenSocketEvent) => void) | undefined): (event: TokenSocketEvent) => void {
  return (event) => {
    try {
      onEvent?.(event);
    } catch {
      // a failing log hook must not take a connection down
    }
  };
}
