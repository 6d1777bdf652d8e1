/** What a client is told when a request is refused or fails: a code, and a message that leaks nothing. */
import { AdmissionRejectedError, SluiceError } from '../../core/errors.js';
import type { ErrorFrame } from '../protocol.js';
import { upstreamApiError } from '../openai-wire.js';

export function errorFrame(id: string | undefined, code: string, message: string, retryAfter?: number): ErrorFrame {
  const frame: ErrorFrame = id === undefined ? { type: 'error', code, message } : { type: 'error', id, code, message };
  return retryAfter === undefined ? frame : { ...frame, retry_after_ms: retryAfter };
}

/** How long a refused request should wait (the server was busy), ms; else undefined. */
export function retryAfterOf(err: unknown): number | undefined {
  return err instanceof AdmissionRejectedError ? err.retryAfter : undefined;
}

/** A `SluiceError`'s code, else `fallback`. */
export function codeOf(err: unknown, fallback: string): string {
  return err instanceof SluiceError ? err.code : fallback;
}

/**
 * Only sluice's own messages are passed on: anything else may carry internals (paths,
 * hosts, keys). A guard's block says only that: its score and thresholds are the operator's.
 */
export function messageOf(err: unknown): string {
  if (!(err instanceof SluiceError)) return 'the generation failed';
  return err.code === 'GUARD_BLOCKED' ? 'the request was blocked by the content policy' : err.message;
}

/** What an `error` frame says of a failed generation: its code, its message and how long to wait. */
export interface FailureWords {
  readonly code: string;
  readonly message: string;
  readonly retryAfter: number | undefined;
}

/**
 * A failed generation in an `error` frame's words. An upstream's failure is judged as the HTTP
 * answer judges it (the same message; its OpenAI code in capitals, `INVALID_REQUEST` for a
 * client's mistake without one; `Retry-After` as ms), never with the upstream's words for a failure
 * that is not the client's; any other failure by its `SluiceError` code, else `fallback`.
 */
export function failureWords(err: unknown, fallback: string): FailureWords {
  const upstream = upstreamApiError(err);
  if (upstream === undefined) return { code: codeOf(err, fallback), message: messageOf(err), retryAfter: retryAfterOf(err) };
  const code = upstream.code ?? (upstream.status < 500 ? 'invalid_request' : 'upstream_error');
  const wait = upstream.headers['retry-after'];
  return { code: code.toUpperCase(), message: upstream.message, retryAfter: wait === undefined ? undefined : Number(wait) * 1000 };
}
