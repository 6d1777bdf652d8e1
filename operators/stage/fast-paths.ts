/**
 * The stage's fast paths, apart from its general path (`StageRun`), each a named override that
 * takes a shorter way in a case it can prove and hands every other case to the general path:
 *
 * - the `async` hop: an element from settled async work upstream starts at once on a spare task;
 * - the `async` function path: work declared `async` is called from a call site of its own;
 * - reused Promise tasks: an ordered stage without timeouts runs Promise work on retired tasks;
 * - the settle shortcut: the oldest task's one output leaves as its Promise settles.
 *
 * (The context-free call of one-parameter arrows is decided in `stage()`; the direct send of a
 * plain result stays on the general path, where a check would cost the sync hop.) Each case is
 * on only when the switch below was on as the stage was made, so the switch costs nothing per
 * element; a property test runs random pipelines with it off and on and compares the runs.
 */
import { isSampled, traceOf, type TraceRef } from '../../src/core/trace.js';
import { PROMISE, kindOf } from './result-kind.js';
import { OrderedRun } from './ordered.js';
import { FAILED, SETTLED, type Pending, type Task, type WorkContext } from './task.js';

let enabled = true;

/** @internal For tests: stages made while off run their general path only. */
export function setFastPaths(on: boolean): void {
  enabled = on;
}

export function fastPathsOn(): boolean {
  return enabled;
}

/** The run every ordered stage makes: `OrderedRun` with the fast paths its configuration allows. */
export class FastStageRun<I, O> extends OrderedRun<I, O> {
  /**
   * The `async` hop: an unsampled element from settled async work (the sender checked, so the
   * trace is not read again) reaching an idle stage with a spare task starts here, apart from the
   * sync hop's `take` (rule 4 in run.ts; see `Outlet.nextSettled`).
   */
  override onSettledNext(value: I, trace: TraceRef): void {
    // A spare task means a free slot: tasks are made only to start work in a free slot, so in flight plus spare never exceeds `concurrency`.
    // Downstream demand is not asked: work starts in a free slot whatever the demand (as from the buffer), and its Promise result
    // cannot go out before `taskFulfilled`, which asks, so asking here would be asking twice. A consumer that left has cancelled us.
    if (this.hop === true && this.wip === 0 && this.buffer.length === 0 && this.spare !== undefined) {
      this.wip = 1; // as in `take`
      this.startSettled(value, this.seq++, trace);
      if (this.wip === 1) this.wip = 0;
      else this.drainDeferred();
    } else {
      super.onSettledNext(value, trace);
    }
  }

  /** `startAsync` for an unsampled element, a spare task at hand, in a stage whose Promise tasks need no timer. */
  private startSettled(value: I, seq: number, trace: TraceRef): void {
    const context = this.passContext === true ? this.contextFor(seq, (trace = traceOf(trace))) : undefined;
    const result = this.callAsync(value, context, seq, trace, 0);
    // An `async` function's result is a native Promise, or THREW (a symbol): `typeof` is enough.
    if (typeof result === 'object') this.startPromise(this.spare!, value, context, seq, trace, result as Promise<O>);
    else this.startLater(value, context, seq, trace, result, kindOf(result), 0);
  }

  /** `startNow` for an `async` function: its result is a native Promise (anything else, from a Proxy say, takes the general path). */
  protected override startAsync(value: I, seq: number, trace: TraceRef): void {
    const context = this.passContext === true ? this.contextFor(seq, (trace = traceOf(trace))) : undefined;
    const startedAt = isSampled(trace) ? this.startTime(trace) : 0;
    const result = this.callAsync(value, context, seq, trace, 0);
    if (!(result instanceof Promise)) this.startLater(value, context, seq, trace, result, kindOf(result), startedAt);
    else if (this.spare !== undefined && this.plainPromises === true && !isSampled(trace)) this.startPromise(this.spare, value, context, seq, trace, result);
    else this.startTask(this.taskFor(value, context, seq, trace, 0, PROMISE), result, PROMISE, startedAt, -1);
  }

  protected override begin(pending: Pending<I>): void {
    if (this.asyncWork === false) {
      super.begin(pending);
      return;
    }
    const context = this.beginContext(pending);
    const trace = pending.trace;
    const startedAt = isSampled(trace) ? this.now() : 0;
    const result = this.callAsync(pending.value, context, pending.seq, trace, pending.merged);
    if (result instanceof Promise && this.spare !== undefined && this.plainPromises === true && !isSampled(trace) && pending.merged === 0) {
      this.startPromise(this.spare, pending.value, context, pending.seq, trace, result);
    } else {
      this.beginWith(pending, context, startedAt, result);
    }
  }

  /**
   * `startTask` at its smallest: a spare task, an ordered stage without timeouts, an unsampled
   * element. Its callers test for that inline, not in a shared helper (rule 2 in run.ts).
   */
  private startPromise(task: Task<I, O>, value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, result: Promise<O>): void {
    this.spare = task.after;
    task.restart(value, context, seq, trace);
    this.inFlight++;
    this.enlist(task);
    result.then(task.fulfilled, task.rejected);
  }

  override taskFulfilled(task: Task<I, O>, output: O): void {
    // The oldest task settled with its one output, nothing being delivered, downstream wanting it: out at once.
    if (task.state < FAILED && this.wip === 0 && task.quick === true && this.firstTask === task && this.outlet.wantsSettled() === true) {
      this.deliverSettled(task, output);
    } else {
      super.taskFulfilled(task, output);
    }
  }

  /**
   * The settle shortcut: what `drain` would do for this task, then the drain for the rest.
   * The task is retired before its output is emitted: nothing after the emit reads it, so the
   * emit's inlined code ends the hop. A consumer that leaves during the emit finds it
   * delivered, as it is; a second call of a misbehaving thenable finds it closed (`state >= FAILED`).
   */
  private deliverSettled(task: Task<I, O>, output: O): void {
    const trace = task.trace;
    this.dropOldest(task);
    this.inFlight--;
    this.passed++;
    if (task.merged !== 0) this.stats.deliveredCount += task.merged;
    if (task.reusable === true) this.spareTask(task);
    else this.closeSettled(task);
    this.wip = 1; // demand signalled during the emit finds the drain below due
    // `wants()` said yes in `taskFulfilled` and nothing since ran user code (a Promise task has no
    // subscription, iterator or timer to close): `nextSettled` does not look again.
    this.outlet.nextSettled(output, trace);
    this.wip = 0;
    // Nothing buffered and no task behind this one with something to deliver (a stage keeping up): the drain
    // would only ask upstream for more. A counter, not a look at the next task (rule 6 in run.ts).
    if (this.buffer.length !== 0 || this.upstreamDone === true || this.readyBehind !== 0) this.drain();
    else if (this.inlet.starving === true && this.terminated === false) this.askMore(); // a slot was just freed: the room is not 0, no pause to count
  }

  /** Out of line: a task `deliverSettled` cannot spare. */
  private closeSettled(task: Task<I, O>): void {
    task.state = SETTLED;
    this.closeTask(task);
  }
}
