/**
 * One structured entry per request, for an operator's log: who asked which model, how it
 * ended, how many tokens, how fast. Never the prompt, a token's text or a key: only codes,
 * counts, times and the messages of errors.
 */
import { AbortedError, SluiceError, errorMessage } from '../core/errors.js';

/** One finished request as the request log records it. */
export interface RequestLogEntry {
  readonly transport: 'http' | 'ws';
  /** Over HTTP the response's `x-request-id` (a completion's own id, `chatcmpl-…`, else `req-…`); `<connection>:<request id>` over WebSocket. */
  readonly id: string;
  readonly tenant?: string;
  readonly model?: string;
  /** `completed`, `failed`, `aborted` (the client left or cancelled), `interrupted` (shutdown) or `refused` (never started). */
  readonly outcome: 'completed' | 'failed' | 'aborted' | 'interrupted' | 'refused';
  /** The HTTP status sent. */
  readonly status?: number;
  readonly finishReason?: string;
  readonly inputTokens?: number;
  readonly outputTokens?: number;
  /** From arrival to the first token sent, ms. */
  readonly ttftMs?: number;
  readonly durationMs: number;
  readonly error?: { readonly code: string; readonly message: string; readonly cause?: string };
}

/** Receives one structured entry per finished request (for pino or any logger). */
export type RequestLog = (entry: RequestLogEntry) => void;

/** How a request that ended with `error` reads in the log. */
export function outcomeOf(error: unknown): RequestLogEntry['outcome'] {
  if (error === undefined) return 'completed';
  if (error instanceof AbortedError || (error instanceof SluiceError && error.code === 'ABORTED')) return 'aborted';
  if (error instanceof SluiceError && (error.code === 'SHUTDOWN' || error.code === 'SHUTTING_DOWN')) return 'interrupted';
  return 'failed';
}

/** An error as a log field: its code, its message, and its cause's message (where a 500 comes from). */
export function errorField(error: unknown): RequestLogEntry['error'] | undefined {
  if (error === undefined) return undefined;
  const code =
    error instanceof SluiceError
      ? error.code
      : typeof error === 'object' && error !== null && typeof (error as { code?: unknown }).code === 'string'
        ? (error as { code: string }).code
        : error instanceof Error
          ? error.name
          : 'ERROR';
  const message = errorMessage(error);
  const cause =
    error instanceof Error && error.cause !== undefined
      ? error.cause instanceof Error
        ? `${error.cause.name}: ${error.cause.message}`
        : String(error.cause)
      : undefined;
  return cause === undefined ? { code, message } : { code, message, cause };
}

export function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
