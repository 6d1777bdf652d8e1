/** What a client is told when a request is refused or fails: a code, and a message that leaks nothing. */
import { SluiceError } from '../../core/errors.js';
import type { ErrorFrame } from '../protocol.js';

export function errorFrame(id: string | undefined, code: string, message: string): ErrorFrame {
  return id === undefined ? { type: 'error', code, message } : { type: 'error', id, code, message };
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
