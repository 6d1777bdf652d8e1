/**
 * Every error sluice raises is a `SluiceError` with a stable `code`, the stage it
 * came from (when there is one) and a hint saying what to do about it.
 */
import { installCommand } from './peer-list.js';

/** The `code` of every sluice error: stable strings to branch on, logged and counted as they are. */
export type SluiceErrorCode =
  | 'INVALID_OPTIONS'
  | 'ILLEGAL_DEMAND'
  | 'OVERFLOW'
  | 'UNPAUSABLE_SOURCE'
  | 'WORK_FAILED'
  | 'TIMEOUT'
  | 'DRAIN_TIMEOUT'
  | 'ABORTED'
  | 'BATCH_MISMATCH'
  // Operators define their own codes (e.g. 'CIRCUIT_OPEN'); the union keeps the core ones autocompleted.
  | (string & {});

/** The base of every error sluice throws: a stable `code`, the stage it came from and a hint on what to do. */
export class SluiceError extends Error {
  readonly code: SluiceErrorCode;
  readonly stage: string | undefined;
  readonly hint: string | undefined;

  constructor(code: SluiceErrorCode, message: string, details: { stage?: string; hint?: string; cause?: unknown } = {}) {
    super(details.hint ? `${message} ${details.hint}` : message, details.cause === undefined ? undefined : { cause: details.cause });
    this.name = new.target.name;
    this.code = code;
    this.stage = details.stage;
    this.hint = details.hint;
  }
}

/** Options that fail validation. `issues` carry the path of each bad field. */
export class InvalidOptionsError extends SluiceError {
  readonly issues: readonly { path: string; message: string }[];
  constructor(what: string, issues: readonly { path: string; message: string }[]) {
    const list = issues.map((i) => `  - ${i.path || '(root)'}: ${i.message}`).join('\n');
    super('INVALID_OPTIONS', `Invalid ${what}:\n${list}`);
    this.issues = issues;
  }
}

/** Reactive Streams §3.9: a non-positive request signals an error instead of throwing. */
export class IllegalDemandError extends SluiceError {
  constructor(readonly requested: number) {
    super('ILLEGAL_DEMAND', `request(${requested}) is not allowed: demand must be a positive integer (Reactive Streams §3.9).`);
  }
}

/** Policy `fail`: an element arrived while the buffer was full. */
export class OverflowError extends SluiceError {
  constructor(
    stage: string,
    readonly capacity: number,
  ) {
    super('OVERFLOW', `Stage "${stage}" overflowed its buffer (capacity ${capacity}, policy "fail").`, {
      stage,
      hint: 'Raise the capacity, or choose policy "pause", "shed-incoming", "shed-oldest" or "conflate".',
    });
  }
}

/** Policy `pause` met a producer that cannot be paused. */
export class UnpausableSourceError extends SluiceError {
  constructor(
    stage: string,
    readonly capacity: number,
  ) {
    super(
      'UNPAUSABLE_SOURCE',
      `Stage "${stage}" (capacity ${capacity}, policy "pause") is full and its source cannot be paused (a plain Observable, Subject or event source pushes without demand).`,
      {
        stage,
        hint: 'Wrap the source with fromPush(source, { capacity, policy }) choosing "shed-incoming", "shed-oldest", "conflate" or "fail", or build it with fromIterable/fromAsyncIterable/fromReadable so it can be paused.',
      },
    );
  }
}

/** User work threw or rejected; carries the stage and the element's sequence number. */
export class StageError extends SluiceError {
  constructor(
    stage: string,
    readonly seq: number,
    cause: unknown,
  ) {
    super('WORK_FAILED', `Stage "${stage}" failed on element #${seq}: ${errorMessage(cause)}`, { stage, cause });
  }
}

/** A stage's work ran past its `timeout`: the element fails (or is handled by the stage's `errorPolicy`). */
export class StageTimeoutError extends SluiceError {
  constructor(
    stage: string,
    readonly seq: number,
    readonly timeout: number,
  ) {
    super('TIMEOUT', `Stage "${stage}" timed out on element #${seq} after ${timeout} ms.`, {
      stage,
      hint: 'Raise `timeout`, or make the work honour its AbortSignal sooner.',
    });
  }
}

/** A stage did not drain within `drainTimeout` after upstream completed: the elements still buffered or in flight are failed. */
export class DrainTimeoutError extends SluiceError {
  constructor(
    stage: string,
    readonly deadline: number,
    readonly abandoned: number,
  ) {
    super('DRAIN_TIMEOUT', `Stage "${stage}" did not drain within ${deadline} ms; ${abandoned} element(s) were failed.`, { stage });
  }
}

/** The reason a kill switch or an abort gives to in-flight work. */
export class AbortedError extends SluiceError {
  constructor(stage: string | undefined, reason: string) {
    super('ABORTED', stage ? `Stage "${stage}" was aborted: ${reason}` : `Aborted: ${reason}`, stage === undefined ? {} : { stage });
  }
}

/** A batch was given results (or traces) whose count differs from its items: results could not be mapped back. */
export class BatchMismatchError extends SluiceError {
  constructor(
    readonly expected: number,
    readonly actual: number,
  ) {
    super('BATCH_MISMATCH', `A batch of ${expected} item(s) got ${actual} result(s); results map back to items by position.`, {
      hint: 'Return exactly one result per item, in item order (e.g. batch.withResults(outputs) with outputs.length === batch.size).',
    });
  }
}

/** A prompt with no content: an empty string, no messages, or a template that rendered empty. */
export class EmptyPromptError extends SluiceError {
  constructor(detail = 'the prompt is empty') {
    super('EMPTY_PROMPT', `Empty prompt: ${detail}.`, {
      hint: 'Pass a non-empty `prompt`, or `messages` with a non-empty `content`; a template renders empty when its variables are empty.',
    });
  }
}

/** @internal What was thrown, in words: an `Error`'s message, anything else as a string. */
export function errorMessage(cause: unknown): string {
  return cause instanceof Error ? cause.message : String(cause);
}

/** Optional peer dependencies an entry point or a command needs are not installed: the message names each and the one install command. */
export class MissingPeerError extends SluiceError {
  /** The first missing package. */
  readonly packageName: string;
  /** Every missing package, in the order they are needed. */
  readonly packageNames: readonly string[];
  constructor(packageNames: string | readonly string[], entry: string, cause?: unknown) {
    const names = typeof packageNames === 'string' ? [packageNames] : [...packageNames];
    const listed = names.map((name) => `"${name}"`).join(', ');
    super(
      'MISSING_PEER',
      names.length === 1 ? `${entry} needs the package ${listed}, which is not installed.` : `${entry} needs the packages ${listed}, which are not installed.`,
      { hint: `Install ${names.length === 1 ? 'it' : 'them'} next to sluice: ${installCommand(names)}`, cause },
    );
    this.packageName = names[0]!;
    this.packageNames = names;
  }
}

/** Admission control turned a request away at the door. */
export class AdmissionRejectedError extends SluiceError {
  constructor(
    stage: string,
    readonly tenant: string,
    /** How long (ms) the tenant should wait before sending again. */
    readonly retryAfter: number,
    readonly reason: 'queue-full' | 'evicted',
  ) {
    super(
      'ADMISSION_REJECTED',
      reason === 'queue-full'
        ? `Admission "${stage}" rejected a request of tenant "${tenant}": the queue is full.`
        : `Admission "${stage}" evicted a request of tenant "${tenant}" for one of higher priority.`,
      { stage, hint: `Retry after ${retryAfter} ms (e.g. HTTP 429 with Retry-After).` },
    );
  }
}
