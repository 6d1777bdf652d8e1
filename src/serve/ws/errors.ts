/** What a client is told when a request is refused or fails: a code, and a message that leaks nothing. */
import { AdmissionRejectedError, SluiceError } from '../../core/errors.js';
import type { ErrorFrame } from '../protocol.js';

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
