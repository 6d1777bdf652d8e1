/**
 * An ordered stage's delivery: outputs leave in input order, so only the oldest task in flight
 * may deliver; a task that becomes ready behind it is counted in `readyBehind` and waits.
 * `FastStageRun` (fast-paths.ts) is the class made, with the fast paths this order allows.
 */
import type { WorkContext, Task } from './task.js';
import { WORKING } from './task.js';
import { PLAIN } from './result-kind.js';
import type { TraceRef } from '../../src/core/trace.js';
import { StageRun } from './run.js';

export abstract class OrderedRun<I, O> extends StageRun<I, O> {
  /** Tasks in flight behind the oldest that became ready (an output, or done) before it, marked `queued`. */
  protected readyBehind = 0;

  /** `task` starts after every task in flight (a retired task's `after` was reset by `restart` or `reuse`). */
  protected enlist(task: Task<I, O>): void {
    if (this.lastTask === undefined) this.firstTask = task;
    else this.lastTask.after = task;
    this.lastTask = task;
  }

  /** The oldest task, `task`, leaves the list (before `spareTask` reuses its `after`). */
  protected dropOldest(task: Task<I, O>): void {
    const next = task.after;
    this.firstTask = next;
    if (next === undefined) this.lastTask = undefined;
  }

  protected markReady(task: Task<I, O>): void {
    if (task.queued === false && task !== this.firstTask) {
      task.queued = true; // marked once, until retired (see `readyBehind`)
      this.readyBehind++;
    }
  }

  /** The oldest task has an output or is done. */
  protected hasReady(): boolean {
    const head = this.firstTask;
    return head !== undefined && (head.outputs > 0 || head.state !== WORKING);
  }

  protected deliver(): void {
    for (let task = this.firstTask; task !== undefined && this.terminated === false; task = this.firstTask) {
      if (task.outputs > 0) {
        if (this.emitFrom(task) === false) return;
      } else if (task.state !== WORKING) {
        this.dropOldest(task);
        this.retire(task);
      } else {
        return;
      }
    }
  }

  protected delist(task: Task<I, O>): void {
    if (task.queued === true) {
      task.queued = false;
      this.readyBehind--;
    }
  }

  /** Behind the tasks in flight: it waits for its turn as a task. */
  protected startPlain(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, output: O, startedAt: number): void {
    this.startTask(this.taskFor(value, context, seq, trace, 0, PLAIN), output, PLAIN, startedAt, -1);
  }

  protected nothingAhead(): boolean {
    return this.firstTask === undefined;
  }
}
