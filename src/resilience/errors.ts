/**
 * Errors of the resilience operators: each a `SluiceError` with its own code, the
 * stage when known, and what to do about it.
 */
import { SluiceError, errorMessage } from '../core/errors.js';

export { AdmissionRejectedError } from '../core/errors.js';

/** Which deadline a token stream missed. */
export type StreamTimeoutKind = 'total' | 'idle';

/** A token stream ran past its total deadline, or went quiet longer than its idle limit. */
export class StreamTimeoutError extends SluiceError {
  constructor(
    readonly kind: StreamTimeoutKind,
    readonly timeout: number,
    stage?: string,
  ) {
    super(
      'STREAM_TIMEOUT',
      kind === 'total'
        ? `The token stream did not finish within ${timeout} ms (total timeout).`
        : `The token stream produced nothing for ${timeout} ms (idle timeout).`,
      {
        ...(stage === undefined ? {} : { stage }),
        hint: kind === 'total' ? 'Raise `total`, or ask the model for fewer tokens.' : 'Raise `idle`, or check that the model server is streaming.',
      },
    );
  }
}

/** The circuit is open (or half-open with every probe taken): the call was not made. */
export class CircuitOpenError extends SluiceError {
  constructor(
    readonly breaker: string,
    readonly state: 'open' | 'half-open',
    /** How long (ms) until the breaker lets a call through again, at the earliest. */
    readonly retryAfter: number,
  ) {
    super('CIRCUIT_OPEN', `Circuit "${breaker}" is ${state}: the call was not made.`, {
      hint: `Retry after ${retryAfter} ms, or route to a fallback worker.`,
    });
  }
}

/** Every worker of a fallback chain failed before its first output. `cause` is the last failure. */
export class FallbackExhaustedError extends SluiceError {
  constructor(
    stage: string | undefined,
    readonly failures: readonly { readonly worker: string; readonly error: unknown }[],
  ) {
    super('FALLBACK_EXHAUSTED', `Every worker failed: ${failures.map((f) => `${f.worker} (${errorMessage(f.error)})`).join(', ')}.`, {
      ...(stage === undefined ? {} : { stage }),
      cause: failures[failures.length - 1]?.error,
    });
  }
}
