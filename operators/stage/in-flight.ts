/**
 * A stage run's work in flight: its tasks, oldest first, and the retired tasks kept for reuse;
 * and each task's course: started, settled or streaming, delivered, retired. `StageRun` (run.ts)
 * owns the intake, the buffer, the drain loop and the run's end; `OrderedRun` (ordered.ts) and
 * `UnorderedRun` (unordered.ts) decide which ready task delivers next.
 */
import type { Observable, SchedulerLike } from 'rxjs';
import { LinkedRun } from '../../src/flow/linked-run.js';
import { withLink, type DemandLink, type CoreOutlet } from '../../src/flow/demand.js';
import { activeIntrospector, subscribedWithin, type InspectedRun, type RunDescription } from '../../src/flow/introspection.js';
import { callHook } from '../../src/flow/report.js';
import type { StageStats } from '../../src/flow/stats.js';
import { SluiceError, StageError, StageTimeoutError } from '../../src/core/errors.js';
import { isSampled, settlementOf, traceOf, type Traced, type TraceRef } from '../../src/core/trace.js';
import { type Settlement, forEachSettlement } from '../../src/core/settlement.js';
import type { WorkResult } from '../../src/flow/work.js';
import type { StageConfig } from './options.js';
import { finishRecord, placeRecord } from './records.js';
import { ASYNC_ITERABLE, OBSERVABLE, PLAIN, PROMISE } from './result-kind.js';
import { CLOSED, FAILED, SETTLED, Task, WORKING, type TaskOwner, type TaskState, type WorkContext } from './task.js';

export abstract class InFlight<I, O> extends LinkedRun<I | Traced<I>> implements TaskOwner<I, O>, InspectedRun {
  abstract readonly config: StageConfig;
  abstract readonly stats: StageStats;
  protected abstract override readonly outlet: CoreOutlet<Traced<O>>;
  protected abstract readonly name: string;
  protected abstract readonly scheduler: SchedulerLike;
  /** Ordered, no timeout: a Promise task needs no timer and is listed in start order. */
  protected abstract readonly plainPromises: boolean;
  /** Elements delivered with one output emitted, nothing merged (see `StageRun.passedNow`). */
  protected abstract passed: number;
  abstract describe(): RunDescription;
  abstract demandNow(): number;
  abstract ownLink(): DemandLink;
  protected abstract now(): number;
  abstract fail(error: unknown): void;

  /**
   * Tasks in flight, oldest first, linked by `after` (and, unordered, `before`). Ordered, the
   * oldest is the one to deliver next. Intrusive, not a `Ring`: appending is one field store and
   * dropping the oldest reads only that task (figures: docs/internals/stage-hot-path.md).
   */
  protected firstTask: Task<I, O> | undefined = undefined;
  protected lastTask: Task<I, O> | undefined = undefined;
  /** Retired tasks to reuse, linked by `after`: at most `concurrency` of them. */
  protected spare: Task<I, O> | undefined = undefined;
  protected inFlight = 0;

  // ---- what ordered and unordered runs do apart (ordered.ts, unordered.ts) ----

  /** A started task joins the list of tasks in flight. */
  protected abstract enlist(task: Task<I, O>): void;
  /** `task` has something to deliver (an output, or it is done): it is marked for `deliver`. */
  protected abstract markReady(task: Task<I, O>): void;
  /** Something to deliver now. */
  protected abstract hasReady(): boolean;
  /** Emits what is ready while downstream wants, retiring the tasks that are done. */
  protected abstract override deliver(): void;
  /** A task being retired leaves the run's bookkeeping of ready and listed tasks. */
  protected abstract delist(task: Task<I, O>): void;

  /**
   * A task for an element whose work returned a result of `kind`: a spare one if any. Outputs of
   * one element share its context, so work with many (an Observable, an AsyncIterable) makes it now (see `TraceRef`).
   */
  protected taskFor(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number, kind: number): Task<I, O> {
    if (kind >= OBSERVABLE) trace = traceOf(trace);
    const task = this.spare;
    if (task === undefined) return new Task<I, O>(this, value, context, seq, trace, merged, this.plainPromises);
    this.spare = task.after;
    task.reuse(value, context, seq, trace, merged, this.plainPromises);
    return task;
  }

  /** A retired reusable task waits for a later element (closing it is the flag alone: it never had a timer, subscription or iterator). */
  protected spareTask(task: Task<I, O>): void {
    task.state = CLOSED;
    task.value = undefined as I; // the element's data is not held while the task waits
    task.after = this.spare;
    this.spare = task;
  }

  /** Every task in flight, oldest first (for cancel and fail). */
  protected tasksInFlight(): Task<I, O>[] {
    const tasks: Task<I, O>[] = [];
    for (let task = this.firstTask; task !== undefined; task = task.after) tasks.push(task);
    return tasks;
  }

  /** Nothing in flight any more, nothing kept for reuse (the run ended). */
  protected forgetTasks(): void {
    this.inFlight = 0;
    this.firstTask = this.lastTask = this.spare = undefined;
  }

  // ---- a task's course ----

  /**
   * `task` (from `taskFor`) runs `result`, of `kind`: it joins the tasks in flight. A timed element's
   * task keeps when its work started and how long it waited in the buffer (`enqueuedAt`, -1 if never).
   */
  protected startTask(task: Task<I, O>, result: WorkResult<O>, kind: number, startedAt: number, enqueuedAt: number): void {
    if (isSampled(task.trace)) {
      task.startedAt = startedAt;
      task.queueWait = enqueuedAt >= 0 ? startedAt - enqueuedAt : 0;
    }
    this.inFlight++;
    this.enlist(task);
    if (this.config.timeout !== undefined) this.startTimer(task, this.config.timeout);
    // No closure is made here: a function that makes one allocates its context on every call.
    if (kind === PROMISE) {
      // A Promise calls one callback once (a thenable may not): once retired, nothing can reach the task.
      task.reusable = task.timer === undefined && result instanceof Promise;
      (result as PromiseLike<O>).then(task.fulfilled, task.rejected);
    } else {
      this.startOther(task, result, kind);
    }
  }

  private ready(task: Task<I, O>): void {
    this.markReady(task);
    this.drain();
  }

  /** Emits one output of `task` if downstream wants it; returns whether it did. */
  protected emitFrom(task: Task<I, O>): boolean {
    if (this.outlet.wants() === false) {
      if (isSampled(task.trace) && task.waitingSince < 0) task.waitingSince = this.now();
      return false;
    }
    const output = task.shift();
    this.stats.emittedCount++;
    // Most tasks yield one output, unsampled: nothing more to do here (the rest is out of line, rule 2 in run.ts).
    if (isSampled(task.trace) || (task.outputs === 0 && task.state === WORKING)) this.emittedFrom(task);
    this.outlet.nextTraced(output, task.trace);
    return true;
  }

  /** After `emitFrom` took an output: the time a sampled task waited for demand, and a streaming task's next output. */
  private emittedFrom(task: Task<I, O>): void {
    if (isSampled(task.trace)) {
      if (task.waitingSince >= 0) {
        task.paused += this.now() - task.waitingSince;
        task.waitingSince = -1;
      }
      // An output before the last: it will collect records downstream before this task is done.
      if (task.kept === undefined && task.recorded === false && (task.outputs > 0 || task.state === WORKING)) placeRecord(task, this.name, this.now());
    }
    if (task.outputs > 0) return;
    if (task.state === WORKING) {
      if (task.iterator) this.pullIterator(task);
      else if (task.subscription) task.resumeProducers();
    } else if (isSampled(task.trace)) {
      this.finishRecord(task); // the last output carries the complete record downstream
    }
  }

  protected retire(task: Task<I, O>): void {
    this.delist(task);
    this.inFlight--;
    if (task.state !== FAILED) this.stats.deliveredCount += 1 + task.merged;
    else this.stats.failed += 1 + task.merged;
    if (task.reusable === false) this.closeTask(task);
    if (isSampled(task.trace)) this.finishRecord(task);
    if (task.reusable === true) this.spareTask(task);
  }

  private finishRecord(task: Task<I, O>): void {
    if (task.recorded === false) finishRecord(task, this.name, this.now());
  }
  /** `startTask` for a result that is not a Promise (out of line: Promise work is the hot path). */
  private startOther(task: Task<I, O>, result: WorkResult<O>, kind: number): void {
    switch (kind) {
      case PLAIN:
        task.reusable = task.timer === undefined;
        task.push(result as O);
        this.taskDone(task);
        return;
      case OBSERVABLE:
        this.subscribeResult(task, result as Observable<O>);
        return;
      case ASYNC_ITERABLE:
        task.iterator = (result as AsyncIterable<O>)[Symbol.asyncIterator]();
        this.pullIterator(task);
        return;
    }
  }

  private startTimer(task: Task<I, O>, timeout: number): void {
    task.timer = this.scheduler.schedule(() => {
      task.timer = undefined;
      const error = new StageTimeoutError(this.name, task.seq, timeout);
      task.context?.abort(error);
      this.taskFailed(task, error);
    }, timeout);
  }

  /** An Observable result: the task is its demand link, so a Flow of tokens waits while its output waits. */
  private subscribeResult(task: Task<I, O>, result: Observable<O>): void {
    const subscribe = () =>
      withLink(task, () =>
        result.subscribe({
          next: (output) => this.taskOutput(task, output),
          error: (err: unknown) => this.taskFailed(task, err),
          complete: () => this.streamDone(task),
        }),
      );
    // An inspector learns that the Flows starting now feed this stage (their link is the task, not ours).
    task.subscription = activeIntrospector() === undefined ? subscribe() : subscribedWithin(this, subscribe);
    if (task.state >= FAILED) task.subscription.unsubscribe();
  }

  /** A Promise result settled (called by `Task.fulfilled`). */
  taskFulfilled(task: Task<I, O>, output: O): void {
    if (task.state >= FAILED) return;
    task.push(output);
    this.taskDone(task);
  }

  private pullIterator(task: Task<I, O>): void {
    const iterator = task.iterator!;
    if (task.iterating || task.state !== WORKING) return;
    task.iterating = true;
    iterator.next().then(
      (step) => {
        task.iterating = false;
        if (task.state >= FAILED) return;
        if (step.done) this.streamDone(task);
        else this.taskOutput(task, step.value);
      },
      (err: unknown) => {
        task.iterating = false;
        this.taskFailed(task, err);
      },
    );
  }

  /** An output of streaming work: one more copy of its element is on its way downstream. */
  private taskOutput(task: Task<I, O>, output: O): void {
    if (task.state >= FAILED) return;
    settlementOf(task.trace)?.hold();
    task.push(output);
    this.ready(task);
  }

  /** Streaming work ended: its own copy of the element is done (its outputs settle downstream). */
  private streamDone(task: Task<I, O>): void {
    if (task.state !== WORKING) return;
    forEachSettlement(task.value, settlementOf(task.trace), settleDelivered);
    this.taskDone(task);
  }

  private taskDone(task: Task<I, O>): void {
    if (task.state !== WORKING) return;
    task.state = SETTLED;
    if (task.timer !== undefined) {
      task.timer.unsubscribe();
      task.timer = undefined;
    }
    this.ready(task);
  }

  /**
   * An element's work failed (a task's, or a call that threw): the inspector and the element's
   * source are told, and the `fail` policy ends the run. Returns the error for `onFailure` while the
   * run goes on, else undefined.
   */
  protected elementFailed(value: I, seq: number, trace: TraceRef, err: unknown): SluiceError | undefined {
    // Typed errors pass as they are, thrown or rejected alike: callers match on their code.
    const error = err instanceof SluiceError ? err : new StageError(this.config.name, seq, err);
    activeIntrospector()?.elementFailed?.(this, seq, error);
    forEachSettlement(value, settlementOf(trace), (settlement) => settlement.fail(error));
    if (this.config.errorPolicy !== 'fail') return error;
    this.fail(error);
    return undefined;
  }

  /** Work failed: thrown, rejected (`Task.rejected`), errored, or timed out. */
  taskFailed(task: Task<I, O>, err: unknown): void {
    if (task.state >= FAILED) return;
    const error = this.elementFailed(task.value, task.seq, task.trace, err);
    if (error === undefined) return;
    this.closeTask(task, FAILED);
    // Counted when it leaves its slot (`retire`): ordered, it may wait for its turn, still in flight.
    callHook(this.config.onFailure, { stage: this.config.name, error, value: task.value, seq: task.seq, trace: traceOf(task.trace) });
    this.ready(task);
  }

  /**
   * A streaming task ended early: besides the copy its shed or failure released (its stream's;
   * none if the stream had ended), each output still waiting here was a copy of the element.
   */
  protected releaseOutputs(task: Task<I, O>, settled: boolean): void {
    const settlement = settlementOf(task.trace);
    if (settlement === undefined || (task.subscription === undefined && task.iterator === undefined)) return;
    for (let copy = settled ? 1 : 0; copy < task.outputs; copy++) settlement.shed('cancelled');
  }

  /** The run ends: `task` is aborted and closed; returns its state before, which says how it is counted. */
  protected abortTask(task: Task<I, O>, reason: unknown): TaskState {
    task.context?.abort(reason);
    const state = task.state; // after the abort: its listeners may have ended the work
    this.closeTask(task);
    return state;
  }

  /** Finished, and its last output already went downstream (the consumer may end the run while taking it). */
  protected delivered(task: Task<I, O>, state: TaskState): boolean {
    return state === SETTLED && task.outputs === 0;
  }

  /**
   * Lets go of what the task holds (timer, subscription) and moves it to `next`, `CLOSED` or
   * `FAILED`; an iterator still working is told to return only when it is aborted.
   */
  protected closeTask(task: Task<I, O>, next: typeof CLOSED | typeof FAILED = CLOSED): void {
    const state = task.state;
    if (state >= FAILED) return;
    task.state = next;
    task.timer?.unsubscribe();
    task.timer = undefined;
    task.subscription?.unsubscribe();
    if (task.iterator && state === WORKING && next === CLOSED) {
      task.iterator.return?.().then(undefined, () => {});
    }
  }
}

function settleDelivered(settlement: Settlement): void {
  settlement.deliver();
}
