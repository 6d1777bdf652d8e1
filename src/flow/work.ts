/**
 * What a stage's work function is, receives and reports: the types every layer above the
 * protocol (stages, resilience wrappers, fan-out, AI stages) shares.
 */
import type { Observable } from 'rxjs';
import type { SluiceError } from '../core/errors.js';
import type { ShedReason } from '../core/vocabulary.js';
import type { TraceContext } from '../core/trace.js';

/** What the work function receives beside the value. */
export interface StageContext {
  readonly stage: string;
  /** Sequence number of the element at this stage (0-based, in arrival order). */
  readonly seq: number;
  readonly trace: TraceContext;
  /** Fires on unsubscribe, cancel, kill switch or timeout. Created on first read. */
  readonly signal: AbortSignal;
  /** Notes a decision about this element in its trace (`trace.notes["<stage>.<key>"]`), e.g. a cache hit. */
  note(key: string, value: string | number | boolean): void;
}

/** One value, a Promise of one, or many: an Observable or an AsyncIterable (a token stream). */
export type WorkResult<O> = O | PromiseLike<O> | Observable<O> | AsyncIterable<O>;
/** A stage's work: a function of one element and its context that returns a value, a Promise, an Observable or an async iterable. */
export type Work<I, O> = (value: I, context: StageContext) => WorkResult<O>;

/** Reported to `onShed` for an element a stage dropped: the element, the stage and the reason. */
export interface ShedEvent<T> {
  readonly stage: string;
  readonly reason: ShedReason;
  readonly value: T;
  readonly seq: number;
  readonly trace: TraceContext;
  /**
   * The inputs this shed element stands for: 1, or more when the `conflate` policy had merged
   * others into it. The stage's `stats.shed` counts the same; summing `count` over the events
   * gives it.
   */
  readonly count: number;
}

/** Reported to `onFailure` for an element whose work failed: the element, the stage and the error. */
export interface FailureEvent<T> {
  readonly stage: string;
  readonly error: SluiceError;
  readonly value: T;
  readonly seq: number;
  readonly trace: TraceContext;
}
