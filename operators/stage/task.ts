/** One element's work in flight: its context, its pending value, and the task that carries its result or its outputs. */
import type { Subscription } from 'rxjs';
import type { DemandLink, Resumable } from '../../src/flow/demand.js';
import { Ring } from '../../src/flow/ring.js';
import { type TraceContext, isSampled, type Kept, type TraceRef } from '../../src/core/trace.js';
import type { StageContext } from '../../src/flow/work.js';

/** What a task reports to the run that started it (the run's side of a settled Promise). */
export interface TaskOwner<I, O> {
  taskFulfilled(task: Task<I, O>, output: O): void;
  taskFailed(task: Task<I, O>, err: unknown): void;
}

export class WorkContext implements StageContext {
  // Assigned in the constructor only (`declare`): field initializers add a function to every `new` (rule 2 in run.ts).
  declare readonly stage: string;
  declare readonly seq: number;
  declare readonly trace: TraceContext;
  /** Created on first read of `signal`, or on abort: most work never reads it. */
  declare private controller: AbortController | undefined;

  constructor(stage: string, seq: number, trace: TraceContext) {
    this.stage = stage;
    this.seq = seq;
    this.trace = trace;
    this.controller = undefined;
  }

  get signal(): AbortSignal {
    return (this.controller ??= new AbortController()).signal;
  }

  note(key: string, value: string | number | boolean): void {
    this.trace.note(this.stage, key, value);
  }

  abort(reason: unknown): void {
    const controller = (this.controller ??= new AbortController());
    if (!controller.signal.aborted) controller.abort(reason);
  }
}

/** An element waiting in the buffer. */
export class Pending<I> {
  merged = 0;
  constructor(
    public value: I,
    /** Made a context when work that sees one starts (see `TraceRef`). */
    public trace: TraceRef,
    readonly seq: number,
    readonly enqueuedAt: number,
  ) {}
}

/**
 * A task's state, one of four; the only moves are
 * `WORKING → SETTLED → CLOSED`, `WORKING | SETTLED → FAILED` and `WORKING → CLOSED`:
 * - `WORKING`: its work runs; a streaming task may already hold outputs;
 * - `SETTLED`: its work is done; its outputs wait for demand or, ordered, for its turn;
 * - `FAILED`: its work failed and what it held is released; ordered, it waits for its turn to leave its slot;
 * - `CLOSED`: retired (spare if `reusable`), or aborted while the run ends (cancel, fail).
 * `FAILED` and `CLOSED` are both closed: nothing that settles later reaches the run (`state >= FAILED`).
 * Numbers, not strings: the hot path compares them (`result-kind.ts` does the same).
 */
export type TaskState = typeof WORKING | typeof SETTLED | typeof FAILED | typeof CLOSED;
export const WORKING = 0;
export const SETTLED = 1;
export const FAILED = 2;
export const CLOSED = 3;

/**
 * Work in flight for one input. It is also the demand link of an Observable result,
 * so a Flow of tokens returned by the work is paused while its output waits.
 *
 * A retired task is reused for a later element, its Promise callbacks included, when
 * nothing can call back into it any more: its work returned a plain value or a native
 * Promise (which settles once) and no timer was set. Reuse saves the task, its two
 * callbacks and their context on every element of Promise work.
 *
 * Its course is one `state` (see `TaskState`); beside it: `queued` (marked ready to deliver),
 * `iterating` (an AsyncIterable's `next()` is pending), `recorded` (its sampled record is
 * complete), `quick` and `reusable` (set at start).
 */
export class Task<I, O> implements DemandLink {
  // Field order is memory order: what a settle touches first, then what a start writes (rule 6 in run.ts).
  state: TaskState = WORKING;
  /**
   * Settles by `taskFulfilled`'s shortcut when it can: an ordered stage without timeouts, an unsampled
   * element. Kept on the task, so a settle reads neither the stage's options nor the trace.
   */
  quick = false;
  reusable = false;
  /** The next task in the stage's list of tasks in flight (intrusive: a Set costs a hash per task), or in its list of spare tasks. */
  after: Task<I, O> | undefined = undefined;
  trace: TraceRef;
  merged: number;
  value: I;
  /** Only for work that can see it (see `ignoresContext`): nobody else could read its signal. */
  context: WorkContext | undefined;
  seq: number;
  /** Bound once per task, not per element: `then(task.fulfilled, task.rejected)`. */
  readonly fulfilled: (output: O) => void;
  readonly rejected: (err: unknown) => void;
  outputs = 0;
  /** Outputs waiting for demand: the oldest here, the rest in `more`, allocated only when two wait (most work yields one). */
  private first: O | undefined = undefined;
  /** Unordered: in the stage's queue of tasks with something to deliver. Ordered: counted in `readyBehind`. */
  queued = false;
  /** The previous task in an unordered stage's list of tasks in flight (any of them may leave first). */
  before: Task<I, O> | undefined = undefined;
  private more: Ring<O> | undefined = undefined;
  subscription: Subscription | undefined = undefined;
  iterator: AsyncIterator<O> | undefined = undefined;
  iterating = false;
  timer: Subscription | undefined = undefined;
  startedAt = 0;
  queueWait = 0;
  waitingSince = -1;
  paused = 0;
  recorded = false;
  /** A sampled streaming task's record, placed when its first output left (`placeRecord`), completed by `finishRecord`. */
  kept: Kept | undefined = undefined;
  private outlets: Resumable[] | undefined = undefined;

  constructor(run: TaskOwner<I, O>, value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number, plain: boolean) {
    this.value = value;
    this.context = context;
    this.seq = seq;
    this.trace = trace;
    this.merged = merged;
    this.quick = plain && !isSampled(trace);
    this.fulfilled = (output) => run.taskFulfilled(this, output);
    this.rejected = (err) => run.taskFailed(this, err);
  }

  /** Readies a retired reusable task for another element (no timer, subscription, iterator or outlets were ever set on it). */
  reuse(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number, plain: boolean): void {
    this.value = value;
    this.context = context;
    this.seq = seq;
    this.trace = trace;
    this.merged = merged;
    this.quick = plain && !isSampled(trace);
    this.after = undefined;
    this.state = WORKING;
    this.queued = this.reusable = this.recorded = false;
    this.startedAt = this.queueWait = this.paused = 0;
    this.waitingSince = -1;
  }

  /**
   * `reuse` for an unsampled element of an ordered stage without timeouts: a retired reusable
   * task differs from a fresh one only here (its timing fields are read only when sampled).
   */
  restart(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef): void {
    this.value = value;
    this.context = context;
    this.seq = seq;
    this.trace = trace;
    this.merged = 0;
    this.after = undefined;
    this.state = WORKING;
    this.quick = true;
  }

  push(output: O): void {
    if (this.outputs === 0) this.first = output;
    else (this.more ??= new Ring<O>(2)).push(output);
    this.outputs++;
  }

  /** The oldest waiting output; only while `outputs > 0`. */
  shift(): O {
    const output = this.first as O;
    this.outputs--;
    this.first = this.outputs > 0 ? this.more!.shift() : undefined;
    return output;
  }

  wants(): boolean {
    return this.state < FAILED && this.outputs === 0;
  }
  demand(): number {
    return this.wants() ? 1 : 0;
  }
  beforeEmit(): number {
    return 0;
  }
  afterEmit(): void {}
  attach(outlet: Resumable): void {
    (this.outlets ??= []).push(outlet);
  }
  detach(outlet: Resumable): void {
    const index = this.outlets?.indexOf(outlet) ?? -1;
    if (index >= 0) this.outlets!.splice(index, 1);
  }
  resumeProducers(): void {
    if (this.outlets) for (const outlet of this.outlets.slice()) outlet.resume();
  }
}
