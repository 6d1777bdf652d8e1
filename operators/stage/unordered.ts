/**
 * An unordered stage's delivery: any task with something to deliver may, in the order it became
 * ready (`queue`); a task leaves the list of tasks in flight from wherever it is (`before`, `after`).
 */
import { Ring } from '../../src/flow/ring.js';
import type { TraceRef } from '../../src/core/trace.js';
import type { WorkContext, Task } from './task.js';
import { WORKING } from './task.js';
import { StageRun } from './run.js';

export class UnorderedRun<I, O> extends StageRun<I, O> {
  /** Tasks with something to deliver, in the order they became ready. */
  private readonly queue = new Ring<Task<I, O>>(4);

  /** `task` joins the end of the list of tasks in flight. */
  protected enlist(task: Task<I, O>): void {
    task.before = this.lastTask;
    if (this.lastTask === undefined) this.firstTask = task;
    else this.lastTask.after = task;
    this.lastTask = task;
  }

  protected markReady(task: Task<I, O>): void {
    if (task.queued === false) {
      task.queued = true;
      this.queue.push(task);
    }
  }

  protected hasReady(): boolean {
    return this.queue.length !== 0;
  }

  protected deliver(): void {
    for (let task = this.queue.peek(); task !== undefined && !this.terminated; task = this.queue.peek()) {
      if (task.outputs > 0) {
        if (this.emitFrom(task) === false) return;
      } else {
        this.queue.shift();
        task.queued = false;
        if (task.state !== WORKING) this.retire(task);
      }
    }
  }

  /** `task`, wherever it is in the list, leaves it. */
  protected delist(task: Task<I, O>): void {
    if (task.before === undefined) this.firstTask = task.after;
    else task.before.after = task.after;
    if (task.after === undefined) this.lastTask = task.before;
    else task.after.before = task.before;
  }

  /** No order to keep: it goes out now, past the tasks in flight. */
  protected startPlain(_value: I, _context: WorkContext | undefined, _seq: number, trace: TraceRef, output: O, startedAt: number): void {
    this.emitDirect(output, trace, -1, startedAt, 0);
  }

  protected nothingAhead(): boolean {
    return this.queue.length === 0;
  }
}
