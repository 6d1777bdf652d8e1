/**
 * A stage run's bookkeeping of work in flight: its tasks, oldest first; the retired tasks kept for
 * reuse; and, unordered, the queue of tasks with something to deliver. `StageRun` is its only
 * subclass (one hidden class, so the hot path's field loads stay monomorphic).
 */
import { Ring } from '../../flow/ring.js';
import type { TraceRef } from '../../core/trace.js';
import { Task, type TaskOwner, type WorkContext } from './task.js';

export abstract class InFlight<I, O> implements TaskOwner<I, O> {
  /** Unordered: tasks with something to deliver (ordered stages deliver from `firstTask`). */
  protected readonly queue = new Ring<Task<I, O>>(4);
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
  /** Ordered: tasks in flight behind the oldest that became ready (an output, or done) before it, marked `queued`. */
  protected readyBehind = 0;

  abstract taskFulfilled(task: Task<I, O>, output: O): void;
  abstract taskFailed(task: Task<I, O>, err: unknown): void;

  /** A task for new work: a spare one if any (`quick`: it may settle by the shortcut, see `Task.quick`). */
  protected taskFor(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number, quick: boolean): Task<I, O> {
    const task = this.spare;
    if (task === undefined) return new Task<I, O>(this, value, context, seq, trace, merged, quick);
    this.spare = task.after;
    task.reuse(value, context, seq, trace, merged, quick);
    return task;
  }

  /** A retired reusable task waits for a later element (closing it is the flag alone: it never had a timer, subscription or iterator). */
  protected spareTask(task: Task<I, O>): void {
    task.closed = true;
    task.value = undefined as I; // the element's data is not held while the task waits
    task.after = this.spare;
    this.spare = task;
  }

  /** Ordered: `task` starts after every task in flight (a retired task's `after` was reset by `restart` or `reuse`). */
  protected append(task: Task<I, O>): void {
    if (this.lastTask === undefined) this.firstTask = task;
    else this.lastTask.after = task;
    this.lastTask = task;
  }

  /** Ordered: the oldest task, `task`, leaves the list (before `spareTask` reuses its `after`). */
  protected dropOldest(task: Task<I, O>): void {
    const next = task.after;
    this.firstTask = next;
    if (next === undefined) this.lastTask = undefined;
  }

  /** Unordered: `task` joins the list of tasks in flight. */
  protected link(task: Task<I, O>): void {
    task.before = this.lastTask;
    if (this.lastTask === undefined) this.firstTask = task;
    else this.lastTask.after = task;
    this.lastTask = task;
  }

  /** Unordered: `task`, wherever it is in the list, leaves it. */
  protected unlink(task: Task<I, O>): void {
    if (task.before === undefined) this.firstTask = task.after;
    else task.before.after = task.after;
    if (task.after === undefined) this.lastTask = task.before;
    else task.after.before = task.before;
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
}
