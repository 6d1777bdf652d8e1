/**
 * One subscription of a stage: its intake, its buffer and overflow policies, the drain loop and
 * the run's end; its tasks (start, settle, delivery, retirement) are in in-flight.ts, and which
 * ready task delivers next in ordered.ts (with its fast paths in fast-paths.ts) or unordered.ts.
 *
 * How the hot path is kept fast under V8 (written here once; figures in docs/internals/stage-hot-path.md):
 * 1. Few shapes: `FastStageRun` (ordered) and `UnorderedRun` are the only run classes made, so a
 *    pipeline of one kind keeps its calls monomorphic, and a `Task` or `WorkContext` is always
 *    built the same way, so field loads stay monomorphic.
 * 2. Inlining budget: V8 inlines a call chain only up to a budget of bytecode, and the sync hop
 *    (onTracedNext → take → startNow → call → emitNow → the next stage's onTracedNext) is at it: its
 *    methods stay small and every rarer case (a result that is not a plain value, buffering, tasks,
 *    records, an open link scope) is a call out of line.
 * 3. Flags on hot paths are tested `=== true` / `=== false`: V8 keeps no type for a boolean field,
 *    so a bare `if (flag)` compiles to a full ToBoolean.
 * 4. Feedback is kept per call site and shared by every stage: sync and `async` work are called
 *    from sites of their own, and each fast path has its own, so one kind never turns another generic.
 * 5. No closure is made per element (its context would be allocated on every call): a task binds its
 *    Promise callbacks once and is reused.
 * 6. Memory order: the fields a settle touches come first in `Task`, and counters (`readyBehind`)
 *    are read in place of tasks whose memory is seldom in cache.
 */
import { monotonicNow } from '../../src/core/clock.js';
import { type Observable, asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import { currentLink, swapLink, type DemandLink, type CoreOutlet } from '../../src/flow/demand.js';
import { Inlet } from '../../src/flow/inlet.js';
import type { InspectedRun, RunDescription } from '../../src/flow/introspection.js';
import type { KillEvent } from '../../src/flow/kill-switch.js';
import type { ShedReason } from '../../src/flow/options.js';
import { Ring } from '../../src/flow/ring.js';
import { callHook } from '../../src/flow/report.js';
import type { StageStats } from '../../src/flow/stats.js';
import { AbortedError, DrainTimeoutError, SluiceError } from '../../src/core/errors.js';
import { SeqSampler, TraceContext, Traced, isSampled, settlementOf, traceOf, type Kept, type TraceRef } from '../../src/core/trace.js';
import { forEachSettlement, giveBack } from '../../src/core/settlement.js';
import type { WorkResult, Work } from '../../src/flow/work.js';
import { FAILED, SETTLED, WorkContext, Pending } from './task.js';
import { InFlight } from './in-flight.js';
import type { StageConfig } from './options.js';
import { overflow, type Overflowing } from './overflow.js';
import { recordShed, retriesOf } from './records.js';

import { ASYNC_ITERABLE, THREW, PLAIN, PROMISE, kindOf, threw } from './result-kind.js';

/** A stage's general path, demand accounting included; abstract: `FastStageRun` (ordered) and `UnorderedRun` are the classes made (rule 1). */
export abstract class StageRun<I, O> extends InFlight<I, O> implements Overflowing<I>, InspectedRun {
  protected readonly inlet: Inlet;
  readonly buffer: Ring<Pending<I>>;
  /** Elements held at most (buffered plus in flight): `Infinity` unless the policy pauses. */
  private readonly limit: number;
  private readonly concurrency: number;
  /** Ordered, no timeout: a Promise task needs no timer and is listed in start order (see `startPromise`). */
  protected readonly plainPromises: boolean;
  /** `async` work and `plainPromises`: an unsampled element arriving at an idle stage starts by `startSettled`. */
  private readonly asyncHop: boolean;
  /** `asyncHop` while input is taken (not terminated, upstream not done): `onSettledNext` tests one field for three. */
  protected hop: boolean;
  /** `config.passContext` and `config.asyncWork`, one load nearer on the hop. */
  protected readonly passContext: boolean;
  protected readonly asyncWork: boolean;
  /**
   * A lone producer that stopped for lack of room is resumed once this much is free, not
   * at every freed slot (RxJava and Reactor replenish a prefetch at 75 % the same way):
   * a full stage fed by a fast source would otherwise wake it, take one element and stop
   * it again for every element. Several producers are resumed at any room, so none can
   * be kept out by another that keeps the room just under this.
   */
  private readonly resumeAt: number;
  protected readonly name: string;
  /** The injected scheduler's clock, if any (virtual time); else `monotonicNow()` (`performance.now()`'s time line). */
  private readonly clock: SchedulerLike | undefined;
  private readonly sampler: SeqSampler;
  protected readonly scheduler: SchedulerLike;
  /** Terminated by the consumer leaving (else by a failure or the end): what work returning late counts as. */
  private cancelled = false;
  private pendingError: { error: unknown } | undefined;
  protected seq = 0;
  /** Elements delivered with one output emitted, nothing merged (`passedNow`); the rest is counted in the stats. */
  protected passed = 0;
  private stopKillListener: (() => void) | undefined;
  private drainTimer: Subscription | undefined;

  constructor(
    protected readonly source: Observable<I | Traced<I>>,
    protected readonly work: Work<I, O>,
    readonly config: StageConfig,
    readonly stats: StageStats,
    protected readonly outlet: CoreOutlet<Traced<O>>,
  ) {
    super();
    this.buffer = new Ring(Math.min(config.capacity, 1024));
    this.limit = config.pausing ? config.limit : Infinity;
    this.concurrency = config.concurrency;
    this.plainPromises = config.fastPaths && config.ordered && config.timeout === undefined;
    this.asyncHop = this.plainPromises && config.asyncWork;
    this.hop = this.asyncHop;
    this.passContext = config.passContext;
    this.asyncWork = config.asyncWork;
    this.resumeAt = Math.max(1, Math.floor(config.limit / 4));
    this.name = config.name;
    this.scheduler = config.scheduler ?? asyncScheduler;
    this.inlet = new Inlet(this, {
      scheduler: this.scheduler,
      transitTimeout: config.transitTimeout,
      onLate: () => stats.lateArrivals++,
      onGraceGrown: (grace) => {
        stats.transitSlack = Math.max(stats.transitSlack, grace);
      },
    });
    this.clock = config.scheduler;
    this.sampler = new SeqSampler(config.sampleRate);
  }

  /** A method, not a closure per run, so the clock read inlines (rule 1). */
  protected now(): number {
    return this.clock === undefined ? monotonicNow() : this.clock.now();
  }

  /** What an inspector draws this run as. */
  describe(): RunDescription {
    const { name, capacity, concurrency, policy } = this.config;
    return { name, kind: 'stage', capacity, concurrency, policy };
  }

  demandNow(): number {
    // An output ready and not emitted means it was refused and waits to be resumed: held back (see InspectedRun).
    return this.hasReady() ? 0 : this.outlet.demand();
  }

  ownLink(): DemandLink {
    return this.inlet;
  }

  // ---- Producer (downstream side) ----

  override start(): void {
    this.stopKillListener = this.config.killSwitch?.listen((event) => this.onKill(event));
    if (this.terminated || this.upstreamDone) return; // a kill switch fired before we started
    this.stats.track(this); // until `release`
    super.start();
  }

  /** Work in flight, for `StageStats.inFlight` (read on demand, summed over the stage's runs). */
  inFlightNow(): number {
    return this.inFlight;
  }

  /** For `StageStats.received`: every element received took the next `seq`, so no counter is kept. */
  receivedNow(): number {
    return this.seq;
  }

  /** For `StageStats.delivered` and `emitted`: elements delivered as one unmerged output, counted once for both. */
  passedNow(): number {
    return this.passed;
  }

  /** The consumer went away (`LinkedRun.cancel`): abort work and shed what is buffered, before `release`. */
  protected override onCancel(): void {
    this.cancelled = true;
    this.hop = false;
    this.upstream?.unsubscribe(); // first: a producer holding credit (see `lendsRoom`) must not emit into what follows
    const reason = new AbortedError(this.config.name, 'the consumer unsubscribed');
    for (const pending of this.takeBuffered()) this.shed(pending.value, pending.trace, pending.seq, 'cancelled', 1 + pending.merged);
    for (const task of this.tasksInFlight()) {
      const state = this.abortTask(task, reason);
      if (state === FAILED) {
        this.stats.failed += 1 + task.merged;
        continue;
      }
      if (this.delivered(task, state)) this.stats.deliveredCount += 1 + task.merged;
      else {
        const kept = task.kept; // a streaming task whose first outputs left: its record is marked shed
        task.kept = undefined;
        task.recorded = true;
        this.shed(task.value, task.trace, task.seq, 'cancelled', 1 + task.merged, kept);
        this.releaseOutputs(task, state === SETTLED);
      }
    }
  }

  // ---- RoomOwner (upstream side) ----

  /** `room()` shrinks only by arrivals; it drops to 0 on termination or end of input, and both unsubscribe upstream first. */
  readonly lendsRoom = true;

  room(): number {
    if (this.terminated === true || this.upstreamDone === true) return 0;
    return this.limit - this.buffer.length - this.inFlight;
  }

  // ---- upstream signals ----

  onNext(input: I | Traced<I>): void {
    if (this.terminated === true || this.upstreamDone === true) return this.late(input); // §2.8: late elements after cancel are not taken
    this.accept(input, this.inlet.arrive());
    // An element that was in transit arrived: its producer may be waiting on it.
    if (this.terminated === false && this.upstreamDone === false) this.inlet.signal();
  }

  onAskedNext(input: I | Traced<I>): void {
    if (this.terminated === true || this.upstreamDone === true) return this.late(input);
    this.accept(input, true);
  }

  /** From a stage linked straight to this one: the element's parts, no envelope. */
  onTracedNext(value: I, trace: TraceRef): void {
    if (this.terminated === true || this.upstreamDone === true) return giveBack(value, settlementOf(trace));
    this.take(value, trace, true);
  }

  /** `onTracedNext` for an output of settled async work upstream (the fast paths take some of them a shorter way). */
  onSettledNext(value: I, trace: TraceRef): void {
    if (this.terminated === false && this.upstreamDone === false) this.take(value, trace, true);
    else giveBack(value, settlementOf(trace));
  }

  /** An element that came after the run ended is not taken: its source may offer it again. */
  private late(input: I | Traced<I>): void {
    if (input instanceof Traced) giveBack(input.value, input.trace.settlement);
  }

  // The sync hop starts here: rules 2 and 3 of the header hold from `accept` to `emitNow`.
  private accept(input: I | Traced<I>, asked: boolean): void {
    if (input instanceof Traced) this.take((input as Traced<I>).value, (input as Traced<I>).trace, asked);
    else this.take(input, this.sampler.at(this.seq) === true ? new TraceContext(this.seq, true) : this.seq, asked); // a bare seq: see `TraceRef`
  }

  protected take(value: I, trace: TraceRef, asked: boolean): void {
    const seq = this.seq++; // counts it received (see `receivedNow`)
    // Nothing buffered or being delivered, and a free slot: nothing is ahead of it. A closed outlet wants nothing.
    if (this.wip === 0 && this.buffer.length === 0 && this.inFlight < this.concurrency && this.outlet.wants() === true) {
      // The work runs inside the drain guard: a drain it causes (a shutdown, demand from downstream) waits until the element is placed.
      this.wip = 1;
      this.startNow(value, trace, seq);
      if (this.wip === 1) this.wip = 0;
      else this.drainDeferred();
    } else {
      this.hold(value, trace, seq, asked);
    }
  }

  /** A drain asked for while user code ran under the guard of `take` or `onSettledNext`. */
  protected drainDeferred(): void {
    this.wip = 0;
    this.drain();
  }

  /** Nothing is ahead of the element and downstream wants: work starts at once, and a plain result goes straight out unless ordered tasks are ahead of it. */
  private startNow(value: I, trace: TraceRef, seq: number): void {
    // `begin`'s dispatch copied: direct starts (mostly plain results) keep feedback apart from buffered ones (rule 4).
    if (this.asyncWork === true) {
      this.startAsync(value, seq, trace);
      return;
    }
    const context = this.passContext === true ? this.contextFor(seq, (trace = traceOf(trace))) : undefined;
    const startedAt = isSampled(trace) ? this.startTime(trace) : 0;
    const result = this.call(value, context, seq, trace, 0);
    const kind = kindOf(result);
    // Ordered, every task in flight is queued ahead: a plain result goes straight out only when none is in flight.
    if (kind === PLAIN && this.inFlight === 0 && !threw(result)) this.emitNow(result as O, trace, startedAt);
    else this.startLater(value, context, seq, trace, result, kind, startedAt);
  }

  /** `startNow` for an `async` function: a method of its own, not a branch in `startNow` (rule 2); `FastStageRun` adds its fast path. */
  protected startAsync(value: I, seq: number, trace: TraceRef): void {
    const context = this.passContext === true ? this.contextFor(seq, (trace = traceOf(trace))) : undefined;
    const startedAt = isSampled(trace) ? this.startTime(trace) : 0;
    const result = this.callAsync(value, context, seq, trace, 0);
    this.startLater(value, context, seq, trace, result, kindOf(result), startedAt);
  }

  /** `startNow` for a result that is not a plain value going straight out (out of line, rule 2). */
  protected startLater(
    value: I,
    context: WorkContext | undefined,
    seq: number,
    trace: TraceRef,
    result: WorkResult<O> | typeof THREW,
    kind: number,
    startedAt: number,
  ): void {
    if (threw(result)) return;
    if (kind === PLAIN) this.startPlain(value, context, seq, trace, result as O, startedAt);
    else this.startTask(this.taskFor(value, context, seq, trace, 0, kind), result, kind, startedAt, -1);
    // Deliver what finished at once (an Observable that emitted, other tasks when unordered); a Promise cannot have settled yet.
    if (this.inFlight > 0 && kind !== PROMISE) this.drain();
  }

  /** A plain result of work started at once while tasks are in flight: a task behind them (ordered), or out now (unordered). */
  protected abstract startPlain(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, output: O, startedAt: number): void;
  /** No task is ahead of a plain result that is ready to go out: ordered, none in flight; unordered, none ready. */
  protected abstract nothingAhead(): boolean;

  private hold(value: I, trace: TraceRef, seq: number, asked: boolean): void {
    // Room in the buffer and no timing (most arrivals at a busy stage): `enqueue`'s first case, without the call.
    if (this.buffer.length < this.config.capacity && !isSampled(trace)) {
      this.buffer.push(new Pending(value, trace, seq, -1));
      this.stats.buffered++;
    } else {
      this.enqueue(value, trace, seq, asked);
    }
    // Every slot busy and no drain running: an arrival can start nothing and deliver nothing (a
    // settling task drains), and room only shrank, so there is no one to resume; it may have filled it.
    if (this.inFlight < this.concurrency || this.wip !== 0 || this.terminated === true || this.upstreamDone === true) this.drain();
    else if (this.room() === 0) this.stats.pauses++;
  }

  override onUpstreamComplete(): void {
    if (this.terminated || this.upstreamDone) return;
    this.finishInput();
  }

  onUpstreamError(err: unknown): void {
    if (this.terminated) return;
    this.fail(err);
  }

  // ---- the state machine ----

  private enqueue(value: I, trace: TraceRef, seq: number, asked: boolean): void {
    const pending = new Pending(value, trace, seq, isSampled(trace) ? this.now() : -1);
    if (this.buffer.length < this.config.capacity) {
      this.buffer.push(pending);
      this.stats.buffered++;
    } else {
      overflow(this, pending, asked);
    }
  }

  /** For the `fail` policy (`Overflowing`). */
  failAfterDrain(error: SluiceError): void {
    this.pendingError = { error };
    this.finishInput();
  }

  /** Starts work on a buffered element. A plain result goes straight out when nothing is queued ahead and downstream wants it. */
  protected begin(pending: Pending<I>): void {
    const context = this.beginContext(pending);
    const startedAt = isSampled(pending.trace) ? this.now() : 0;
    const result =
      this.asyncWork === true
        ? this.callAsync(pending.value, context, pending.seq, pending.trace, pending.merged)
        : this.call(pending.value, context, pending.seq, pending.trace, pending.merged);
    this.beginWith(pending, context, startedAt, result);
  }

  /** A buffered element's context, for work that can see one (its trace made a context, see `contextFor`). */
  protected beginContext(pending: Pending<I>): WorkContext | undefined {
    return this.passContext === true ? this.contextFor(pending.seq, (pending.trace = traceOf(pending.trace))) : undefined;
  }

  protected beginWith(pending: Pending<I>, context: WorkContext | undefined, startedAt: number, result: WorkResult<O> | typeof THREW): void {
    const trace = pending.trace;
    if (threw(result)) return;
    const kind = kindOf(result);
    if (kind === PLAIN && this.nothingAhead() === true && this.outlet.wants() === true) {
      this.emitDirect(result as O, trace, pending.enqueuedAt, startedAt, pending.merged);
    } else {
      this.startTask(this.taskFor(pending.value, context, pending.seq, trace, pending.merged, kind), result, kind, startedAt, pending.enqueuedAt);
    }
  }

  /**
   * A context, for work that can see one. The caller passes `trace` on with the outputs too: the
   * work may note decisions in it (callers write `contextFor(seq, (trace = traceOf(trace)))`).
   */
  protected contextFor(seq: number, trace: TraceContext): WorkContext {
    return new WorkContext(this.name, seq, trace);
  }

  /** Runs the work; a throw is reported and yields THREW. */
  private call(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): WorkResult<O> | typeof THREW {
    // Between two linked stages no link scope is open (the emit is direct), so the hot path swaps nothing.
    if (currentLink() !== undefined) return this.callUnlinked(value, context, seq, trace, merged);
    let result: WorkResult<O>;
    try {
      result = this.work(value, context as WorkContext); // undefined only for work that cannot see it
    } catch (err) {
      this.workFailed(value, seq, trace, merged, err);
      return THREW;
    }
    return this.terminated === true ? this.abandon(value, trace, seq, merged, result) : result;
  }

  /**
   * `call` for `async` functions, word for word: a call site of their own, so the sync stages'
   * stays specialised (rule 4 in run.ts).
   */
  protected callAsync(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): WorkResult<O> | typeof THREW {
    if (currentLink() !== undefined) return this.callUnlinked(value, context, seq, trace, merged);
    let result: WorkResult<O>;
    try {
      result = this.work(value, context as WorkContext);
    } catch (err) {
      this.workFailed(value, seq, trace, merged, err);
      return THREW;
    }
    return this.terminated === true ? this.abandon(value, trace, seq, merged, result) : result;
  }

  /** Flows the work subscribes for itself must not link to whoever is emitting to us (a plain operator upstream opened a scope). */
  protected callUnlinked(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): WorkResult<O> | typeof THREW {
    const scope = swapLink(undefined);
    let result: WorkResult<O>;
    try {
      result = this.work(value, context as WorkContext);
    } catch (err) {
      swapLink(scope);
      this.workFailed(value, seq, trace, merged, err);
      return THREW;
    }
    swapLink(scope);
    return this.terminated === true ? this.abandon(value, trace, seq, merged, result) : result;
  }

  /**
   * The run ended while the work ran (the consumer left, or a kill switch aborted, from inside it):
   * the element is accounted for as its buffered peers were, and a result still to come is let go.
   */
  protected abandon(value: I, trace: TraceRef, seq: number, merged: number, result: WorkResult<O>): typeof THREW {
    if (this.cancelled === true) this.shed(value, trace, seq, 'cancelled', 1 + merged);
    else {
      this.stats.failed += 1 + merged;
      giveBack(value, settlementOf(trace));
    }
    const kind = kindOf(result);
    if (kind === PROMISE)
      (result as PromiseLike<O>).then(undefined, () => {}); // a late rejection has no one to tell
    else if (kind === ASYNC_ITERABLE)
      (result as AsyncIterable<O>)
        [Symbol.asyncIterator]()
        .return?.()
        ?.then(undefined, () => {});
    return THREW;
  }

  /** When work on a sampled element straight from upstream starts: the upstream stage's exit time (one clock read per hop). */
  protected startTime(trace: TraceContext): number {
    return trace.lastExit > 0 ? trace.lastExit : this.now();
  }

  /** `emitDirect` for an element straight from upstream (nothing merged, never buffered): fewer arguments on the hop. */
  protected emitNow(output: O, trace: TraceRef, startedAt: number): void {
    this.passed++;
    if (isSampled(trace)) this.recordDirect(trace, -1, startedAt, 0);
    this.outlet.nextTraced(output, trace);
  }

  protected emitDirect(output: O, trace: TraceRef, enqueuedAt: number, startedAt: number, merged: number): void {
    this.passed++;
    if (merged !== 0) this.stats.deliveredCount += merged;
    if (isSampled(trace)) this.recordDirect(trace, enqueuedAt, startedAt, merged);
    this.outlet.nextTraced(output, trace);
  }

  private recordDirect(trace: TraceContext, enqueuedAt: number, startedAt: number, merged: number): void {
    const end = this.now();
    const retries = retriesOf(trace, this.name);
    trace.keep(this.name, enqueuedAt >= 0 ? startedAt - enqueuedAt : 0, end - startedAt, 0, retries, merged, undefined);
    trace.lastExit = end;
  }

  protected workFailed(value: I, seq: number, trace: TraceRef, merged: number, err: unknown): void {
    this.stats.failed += 1 + merged;
    const error = this.elementFailed(value, seq, trace, err);
    if (error !== undefined) callHook(this.config.onFailure, { stage: this.config.name, error, value, seq, trace: traceOf(trace) });
  }

  /** Something buffered or in flight still has to go out before the run can finish. */
  protected holding(): boolean {
    return this.buffer.length !== 0 || this.inFlight !== 0;
  }

  /** `LinkedRun`'s drain loop with a start pass and its own guards kept inline (rule 3): deliver, start work, finish; then ask upstream for more. */
  protected override drain(): void {
    if (this.wip++ !== 0) return;
    do {
      // Each delivery pass runs until it is blocked; only work started since can unblock it at once.
      do {
        this.deliver();
      } while (this.terminated === false && this.startBuffered() === true && this.hasReady() === true);
      if (this.terminated === true) {
        this.wip = 0;
        return;
      }
      if (this.upstreamDone === true && this.holding() === false) {
        this.wip = 0;
        this.finish();
        return;
      }
    } while (--this.wip !== 0);
    if (this.upstreamDone === false) this.askMore();
  }

  /** After a drain: resume producers that stopped for lack of room if there is enough of it now (see `resumeAt`). */
  protected askMore(): void {
    const room = this.room();
    if (room >= this.resumeAt || (room > 0 && this.inlet.producers !== 1)) this.inlet.signal();
    else if (room === 0) this.stats.pauses++;
  }

  /** Starts work on buffered elements while there are free slots; returns whether it started any. */
  private startBuffered(): boolean {
    let started = false;
    while (this.terminated === false && this.buffer.length > 0 && this.inFlight < this.concurrency) {
      const pending = this.buffer.shift()!;
      this.stats.buffered--;
      this.begin(pending);
      started = true;
    }
    return started;
  }

  shed(value: I, trace: TraceRef, seq: number, reason: ShedReason, count: number, kept?: Kept): void {
    this.stats.shed[reason] += count;
    if (isSampled(trace)) recordShed(trace, this.name, reason, kept);
    forEachSettlement(value, settlementOf(trace), (settlement) => settlement.shed(reason));
    if (this.config.onShed !== undefined) callHook(this.config.onShed, { stage: this.config.name, reason, value, seq, trace: traceOf(trace), count });
  }

  /** No more input will be taken; what is buffered and in flight still finishes. */
  private finishInput(): void {
    this.upstreamDone = true;
    this.hop = false;
    this.upstream?.unsubscribe();
    if (this.config.drainTimeout !== undefined && (this.buffer.length > 0 || this.inFlight > 0)) {
      this.drainTimer = this.scheduler.schedule(() => {
        this.drainTimer = undefined;
        const abandoned = this.buffer.length + this.inFlight;
        this.fail(new DrainTimeoutError(this.config.name, this.config.drainTimeout!, abandoned));
      }, this.config.drainTimeout);
    }
    this.drain();
  }

  protected override finish(): void {
    this.terminated = true;
    this.hop = false;
    this.release();
    if (this.pendingError) this.outlet.error(this.pendingError.error);
    else this.outlet.complete();
  }

  /** Ends the stream now with `error`: in-flight work is aborted and it and the buffer count as failed. */
  fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    this.hop = false;
    this.upstream?.unsubscribe();
    let lost = 0;
    for (const pending of this.takeBuffered()) {
      lost += 1 + pending.merged;
      giveBack(pending.value, settlementOf(pending.trace));
    }
    for (const task of this.tasksInFlight()) {
      const state = this.abortTask(task, error);
      if (state === FAILED) lost += 1 + task.merged;
      else if (this.delivered(task, state)) this.stats.deliveredCount += 1 + task.merged;
      else {
        lost += 1 + task.merged;
        giveBack(task.value, settlementOf(task.trace));
        this.releaseOutputs(task, state === SETTLED);
      }
    }
    this.stats.failed += lost;
    this.release();
    this.outlet.error(error);
  }

  private onKill(event: KillEvent): void {
    if (this.terminated) return;
    if (event.kind === 'shutdown') {
      if (!this.upstreamDone) this.finishInput();
    } else {
      this.fail(event.reason instanceof SluiceError ? event.reason : new AbortedError(this.config.name, describe(event.reason)));
    }
  }

  private takeBuffered(): Pending<I>[] {
    this.stats.buffered -= this.buffer.length;
    return this.buffer.drain();
  }

  protected release(): void {
    this.takeBuffered();
    this.forgetTasks();
    this.stats.untrack(this);
    this.upstream?.unsubscribe();
    this.drainTimer?.unsubscribe();
    this.drainTimer = undefined;
    this.inlet.close();
    this.stopKillListener?.();
    this.stopKillListener = undefined;
  }
}

export function describe(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}
