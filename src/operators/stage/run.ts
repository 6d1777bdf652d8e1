/** One subscription of a stage: its buffer, its work in flight, the overflow policies, delivery, and its lifecycle. */
import { monotonicNow } from '../../core/clock.js';
import { Observable, asyncScheduler, type SchedulerLike, type Subscription } from 'rxjs';
import { currentLink, swapLink, withLink, type Outlet, type Producer } from '../../flow/demand.js';
import { Inlet, type RoomOwner } from '../../flow/inlet.js';
import { subscribeUpstream, type UpstreamHandler } from '../../flow/upstream.js';
import type { KillEvent } from '../../flow/kill-switch.js';
import type { ShedReason } from '../../flow/options.js';
import { Ring } from '../../flow/ring.js';
import { callHook } from '../../flow/report.js';
import type { StageStats } from '../../flow/stats.js';
import { AbortedError, DrainTimeoutError, OverflowError, SluiceError, StageError, StageTimeoutError, UnpausableSourceError } from '../../core/errors.js';
import { SeqSampler, TraceContext, Traced, isSampled, traceOf, type Kept, type TraceRef } from '../../core/trace.js';
import type { WorkResult, Work } from '../../flow/work.js';
import { WorkContext, Pending, Task } from './task.js';
import type { StageConfig } from './options.js';

const PLAIN = 0;
const PROMISE = 1;
const OBSERVABLE = 2;
const ASYNC_ITERABLE = 3;
/** What `call` returns when the work threw (and was reported). */
const FAILED: unique symbol = Symbol('failed');
/** Whether `call` failed; the `typeof` test first keeps V8 from comparing a number with a symbol the slow way. */
const threw = (result: unknown): result is typeof FAILED => typeof result === 'symbol' && result === FAILED;

/** Small enough to inline on the hot path: a primitive needs no lookups. */
function kindOf(result: unknown): number {
  return result === null || (typeof result !== 'object' && typeof result !== 'function') ? PLAIN : objectKind(result);
}

function objectKind(result: unknown): number {
  if (typeof (result as PromiseLike<unknown>).then === 'function') return PROMISE;
  if (result instanceof Observable) return OBSERVABLE;
  if (typeof (result as AsyncIterable<unknown>)[Symbol.asyncIterator] === 'function') return ASYNC_ITERABLE;
  return PLAIN;
}

/** One subscription of a stage: the whole state machine, demand accounting included. */
export class StageRun<I, O> implements Producer, RoomOwner, UpstreamHandler<I | Traced<I>> {
  private readonly inlet: Inlet;
  private readonly buffer: Ring<Pending<I>>;
  /** Unordered: tasks with something to deliver (ordered stages deliver from `firstTask`). */
  private readonly queue = new Ring<Task<I, O>>(4);
  /**
   * Tasks in flight, oldest first, linked by `after` (and, unordered, `before`). Ordered, the
   * oldest is the one to deliver next. Intrusive, not a `Ring`: appending is one field store and
   * dropping the oldest reads only that task (figures: docs/internals/stage-hot-path.md).
   */
  private firstTask: Task<I, O> | undefined;
  private lastTask: Task<I, O> | undefined;
  /** Retired tasks to reuse, linked by `after`: at most `concurrency` of them. */
  private spare: Task<I, O> | undefined;
  /** Elements held at most (buffered plus in flight): `Infinity` unless the policy pauses. */
  private readonly limit: number;
  private readonly concurrency: number;
  private readonly ordered: boolean;
  /** Ordered, no timeout: a Promise task needs no timer and is listed in start order (see `startPromise`). */
  private readonly plainPromises: boolean;
  /** `async` work and `plainPromises`: an unsampled element arriving at an idle stage starts by `startSettled`. */
  private readonly asyncHop: boolean;
  /** `asyncHop` while input is taken (not terminated, upstream not done): `onSettledNext` tests one field for three. */
  private hop: boolean;
  /** `config.passContext` and `config.asyncWork`, one load nearer on the hop. */
  private readonly passContext: boolean;
  private readonly asyncWork: boolean;
  /**
   * A lone producer that stopped for lack of room is resumed once this much is free, not
   * at every freed slot (RxJava and Reactor replenish a prefetch at 75 % the same way):
   * a full stage fed by a fast source would otherwise wake it, take one element and stop
   * it again for every element. Several producers are resumed at any room, so none can
   * be kept out by another that keeps the room just under this.
   */
  private readonly resumeAt: number;
  private readonly name: string;
  /** The injected scheduler's clock, if any (virtual time); else `monotonicNow()` (`performance.now()`'s time line). */
  private readonly clock: SchedulerLike | undefined;
  private readonly sampler: SeqSampler;
  private readonly scheduler: SchedulerLike;
  private upstream: Subscription | undefined;
  private upstreamDone = false;
  private terminated = false;
  /** Terminated by the consumer leaving (else by a failure or the end): what work returning late counts as. */
  private cancelled = false;
  private pendingError: { error: unknown } | undefined;
  private inFlight = 0;
  /** Ordered: tasks in flight behind the oldest that became ready (an output, or done) before it, marked `queued`. */
  private readyBehind = 0;
  private seq = 0;
  /** Elements delivered with one output emitted, nothing merged (`passedNow`); the rest is counted in the stats. */
  private passed = 0;
  private wip = 0;
  private stopKillListener: (() => void) | undefined;
  private drainTimer: Subscription | undefined;

  constructor(
    private readonly source: Observable<I | Traced<I>>,
    private readonly work: Work<I, O>,
    private readonly config: StageConfig,
    private readonly stats: StageStats,
    private readonly outlet: Outlet<Traced<O>>,
  ) {
    this.buffer = new Ring(Math.min(config.capacity, 1024));
    this.limit = config.pausing ? config.limit : Infinity;
    this.concurrency = config.concurrency;
    this.ordered = config.ordered;
    this.plainPromises = config.fastPaths && config.ordered && config.timeout === undefined;
    this.asyncHop = this.plainPromises && config.asyncWork;
    this.hop = this.asyncHop;
    this.passContext = config.passContext;
    this.asyncWork = config.asyncWork;
    this.resumeAt = Math.max(1, Math.floor(config.limit / 4));
    this.name = config.name;
    this.scheduler = config.scheduler ?? asyncScheduler;
    this.inlet = new Inlet(this, { scheduler: this.scheduler, transitTimeout: config.transitTimeout, onLate: () => stats.lateArrivals++ });
    this.clock = config.scheduler;
    this.sampler = new SeqSampler(config.sampleRate);
  }

  /** A method, not a closure per run: the call site stays monomorphic and inlines the clock read. */
  private now(): number {
    return this.clock === undefined ? monotonicNow() : this.clock.now();
  }

  // ---- Producer (downstream side) ----

  start(): void {
    this.stopKillListener = this.config.killSwitch?.listen((event) => this.onKill(event));
    if (this.terminated || this.upstreamDone) return; // a kill switch fired before we started
    this.stats.track(this); // until `releaseAll`
    subscribeUpstream(this.source, this.inlet, this);
  }

  pull(): void {
    this.drain();
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

  /** The consumer went away: abort work, shed what is buffered, release everything. */
  cancel(): void {
    if (this.terminated) return;
    this.terminated = true;
    this.cancelled = true;
    this.hop = false;
    this.upstream?.unsubscribe(); // first: a producer holding credit (see `lendsRoom`) must not emit into what follows
    const reason = new AbortedError(this.config.name, 'the consumer unsubscribed');
    for (const pending of this.takeBuffered()) this.shed(pending.value, pending.trace, pending.seq, 'cancelled', 1 + pending.merged);
    for (const task of this.tasksInFlight()) {
      task.context?.abort(reason);
      this.closeTask(task);
      if (task.failed) {
        this.stats.failed += 1 + task.merged;
        continue;
      }
      if (this.delivered(task)) this.stats.deliveredCount += 1 + task.merged;
      else {
        const kept = task.kept; // a streaming task whose first outputs left: its record is marked shed
        task.kept = undefined;
        task.recorded = true;
        this.shed(task.value, task.trace, task.seq, 'cancelled', 1 + task.merged, kept);
      }
    }
    this.releaseAll();
  }

  // ---- RoomOwner (upstream side) ----

  /** `room()` shrinks only by arrivals; it drops to 0 on termination or end of input, and both unsubscribe upstream first. */
  readonly lendsRoom = true;

  room(): number {
    if (this.terminated === true || this.upstreamDone === true) return 0;
    return this.limit - this.buffer.length - this.inFlight;
  }

  // ---- upstream signals ----

  /** Known before the first element, so ending early stops even a synchronous source at once. */
  onSubscribe(subscription: Subscription): void {
    this.upstream = subscription;
  }

  onNext(input: I | Traced<I>): void {
    if (this.terminated === true || this.upstreamDone === true) return; // §2.8: late elements after cancel are ignored
    this.accept(input, this.inlet.arrive());
    // An element that was in transit arrived: its producer may be waiting on it.
    if (this.terminated === false && this.upstreamDone === false) this.inlet.signal();
  }

  onAskedNext(input: I | Traced<I>): void {
    if (this.terminated === true || this.upstreamDone === true) return;
    this.accept(input, true);
  }

  /** From a stage linked straight to this one: the element's parts, no envelope. */
  onTracedNext(value: I, trace: TraceRef): void {
    if (this.terminated === true || this.upstreamDone === true) return;
    this.take(value, trace, true);
  }

  /**
   * `onTracedNext` from a stage whose async work settled, for an unsampled element (the sender
   * checked: reading `trace.sampled` again cost a cache miss per hop at concurrency 16). The common
   * case (async work, an idle stage, a spare task) starts here, with V8 feedback of its own (see
   * `Outlet.nextSettled`), so the sync hop's `take` and `startNow` do not compile it in; every
   * other case goes through `take` as any arrival does.
   */
  onSettledNext(value: I, trace: TraceRef): void {
    // A spare task means a free slot: tasks are made only to start work in a free slot, so in flight plus spare never exceeds `concurrency`.
    // Downstream demand is not asked: work starts in a free slot whatever the demand (as from the buffer), and its Promise result
    // cannot go out before `taskFulfilled`, which asks, so asking here would be asking twice. A consumer that left has cancelled us.
    if (this.hop === true && this.wip === 0 && this.buffer.length === 0 && this.spare !== undefined) {
      this.wip = 1; // as in `take`
      this.startSettled(value, this.seq++, trace);
      if (this.wip === 1) this.wip = 0;
      else this.drainDeferred();
    } else if (this.terminated === false && this.upstreamDone === false) {
      this.take(value, trace, true);
    }
  }

  /** `startAsync` for an unsampled element, a spare task at hand, in a stage whose Promise tasks need no timer. */
  private startSettled(value: I, seq: number, trace: TraceRef): void {
    const context = this.passContext === true ? this.contextFor(seq, (trace = traceOf(trace))) : undefined;
    const result = this.callAsync(value, context, seq, trace, 0);
    // An `async` function's result is a native Promise, or FAILED (a symbol): no `instanceof` (−13 instructions per element per stage).
    if (typeof result === 'object') this.startPromise(this.spare!, value, context, seq, trace, result as Promise<O>);
    else this.startLater(value, context, seq, trace, result, kindOf(result), 0);
  }

  /*
   * The hot path is onTracedNext → take → startNow → call → emitNow → the next stage's
   * onTracedNext. V8 inlines a call chain only up to ~920 bytes of bytecode, and the hop
   * was at that limit, so these stay small and every rarer case (a result that is not a plain
   * value, buffering, tasks, timing records, an open link scope) is a call out of them.
   *
   * Flags on these paths are tested as `flag === true` / `flag === false`, not `if (flag)`:
   * V8 keeps no type for a boolean field, so a bare test compiles to a full ToBoolean (false,
   * "", undetectable, number, BigInt: ~10 instructions when the flag is true). Measured: async
   * 1,209 → 1,138 (concurrency 1) and full timing 763 → 733 instructions per element per stage.
   */
  private accept(input: I | Traced<I>, asked: boolean): void {
    if (input instanceof Traced) this.take((input as Traced<I>).value, (input as Traced<I>).trace, asked);
    else this.take(input, this.sampler.at(this.seq) === true ? new TraceContext(this.seq, true) : this.seq, asked); // a bare seq: see `TraceRef`
  }

  private take(value: I, trace: TraceRef, asked: boolean): void {
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
  private drainDeferred(): void {
    this.wip = 0;
    this.drain();
  }

  /** Nothing is ahead of the element and downstream wants: work starts at once, and a plain result goes straight out unless ordered tasks are ahead of it. */
  private startNow(value: I, trace: TraceRef, seq: number): void {
    // `begin` for an element straight from upstream: its own copy of the dispatch keeps V8's feedback here the direct path's
    // (mostly plain results), apart from buffered starts (mostly Promise work).
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

  /** `startNow` for an `async` function: its result is a native Promise (anything else, from a Proxy say, takes the general path). */
  private startAsync(value: I, seq: number, trace: TraceRef): void {
    const context = this.passContext === true ? this.contextFor(seq, (trace = traceOf(trace))) : undefined;
    const startedAt = isSampled(trace) ? this.startTime(trace) : 0;
    const result = this.callAsync(value, context, seq, trace, 0);
    if (!(result instanceof Promise)) this.startLater(value, context, seq, trace, result, kindOf(result), startedAt);
    else if (this.spare !== undefined && this.plainPromises === true && !isSampled(trace)) this.startPromise(this.spare, value, context, seq, trace, result);
    else this.startTask(value, context, seq, trace, result, PROMISE, startedAt, -1, 0);
  }

  /**
   * `startTask` at its smallest: a spare task, an ordered stage without timeouts, an unsampled element.
   * `startAsync`, `beginAsync` and `startTask` each test that inline, on purpose: a shared helper
   * cost 21 instructions per element per stage, routing them all through `startTask` 53.
   */
  private startPromise(task: Task<I, O>, value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, result: Promise<O>): void {
    this.spare = task.after;
    task.restart(value, context, seq, trace);
    this.inFlight++;
    this.append(task);
    result.then(task.fulfilled, task.rejected);
  }

  /** `startNow` for a result that is not a plain value going straight out: kept out of the hop's inlined code. */
  private startLater(
    value: I,
    context: WorkContext | undefined,
    seq: number,
    trace: TraceRef,
    result: WorkResult<O> | typeof FAILED,
    kind: number,
    startedAt: number,
  ): void {
    if (threw(result)) return;
    if (kind === PLAIN && !this.ordered) this.emitDirect(result as O, trace, -1, startedAt, 0);
    else this.startTask(value, context, seq, trace, result, kind, startedAt, -1, 0);
    // Deliver what finished at once (an Observable that emitted, other tasks when unordered); a Promise cannot have settled yet.
    if (this.inFlight > 0 && kind !== PROMISE) this.drain();
  }

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

  onUpstreamComplete(): void {
    if (this.terminated || this.upstreamDone) return;
    this.finishInput();
  }

  onUpstreamError(err: unknown): void {
    if (this.terminated) return;
    this.fail(err);
  }

  // ---- the state machine ----

  private enqueue(value: I, trace: TraceRef, seq: number, asked: boolean): void {
    const enqueuedAt = isSampled(trace) ? this.now() : -1;
    if (this.buffer.length < this.config.capacity) {
      this.buffer.push(new Pending(value, trace, seq, enqueuedAt));
      this.stats.buffered++;
      return;
    }
    switch (this.config.policy) {
      case 'pause':
        // A linked producer asked first; a bounded overshoot comes only from a plain
        // operator that expands one element into several. Anything else cannot be paused.
        if (asked) {
          this.buffer.push(new Pending(value, trace, seq, enqueuedAt));
          this.stats.buffered++;
        } else {
          this.stats.failed++;
          this.fail(new UnpausableSourceError(this.config.name, this.config.capacity));
        }
        return;
      case 'shed-incoming':
        this.shed(value, trace, seq, 'buffer-full', 1);
        return;
      case 'shed-oldest': {
        const oldest = this.buffer.shift()!;
        this.buffer.push(new Pending(value, trace, seq, enqueuedAt));
        // The hook last, with the buffer whole again: it may unsubscribe, which sheds what is buffered.
        this.shed(oldest.value, oldest.trace, oldest.seq, 'evicted', 1 + oldest.merged);
        return;
      }
      case 'fail':
        // Documented choice: what is buffered and in flight is delivered first, then the error.
        this.stats.failed++;
        this.pendingError = { error: new OverflowError(this.config.name, this.config.capacity) };
        this.finishInput();
        return;
      case 'conflate': {
        const newest = this.buffer.peekLast()!;
        try {
          newest.value = (this.config.conflate as (pending: I, incoming: I) => I)(newest.value, value);
        } catch (err) {
          this.stats.failed++;
          this.fail(new StageError(this.config.name, seq, err));
          return;
        }
        newest.merged++;
        this.stats.conflated++;
        return;
      }
    }
  }

  /** Starts work on a buffered element. A plain result goes straight out when nothing is queued ahead and downstream wants it. */
  private begin(pending: Pending<I>): void {
    let trace = pending.trace;
    let context: WorkContext | undefined;
    if (this.passContext === true) context = this.contextFor(pending.seq, (pending.trace = trace = traceOf(trace)));
    const startedAt = isSampled(trace) ? this.now() : 0;
    if (this.asyncWork === true) this.beginAsync(pending, context, startedAt);
    else this.beginWith(pending, context, startedAt, this.call(pending.value, context, pending.seq, trace, pending.merged));
  }

  /** `begin` for an `async` function: `startAsync`'s shortcut, for a buffered element. */
  private beginAsync(pending: Pending<I>, context: WorkContext | undefined, startedAt: number): void {
    const trace = pending.trace;
    const result = this.callAsync(pending.value, context, pending.seq, trace, pending.merged);
    if (result instanceof Promise && this.spare !== undefined && this.plainPromises === true && !isSampled(trace) && pending.merged === 0) {
      this.startPromise(this.spare, pending.value, context, pending.seq, trace, result);
    } else {
      this.beginWith(pending, context, startedAt, result);
    }
  }

  private beginWith(pending: Pending<I>, context: WorkContext | undefined, startedAt: number, result: WorkResult<O> | typeof FAILED): void {
    const trace = pending.trace;
    if (threw(result)) return;
    const kind = kindOf(result);
    if (kind === PLAIN && (this.ordered === true ? this.firstTask : this.queue.peek()) === undefined && this.outlet.wants() === true) {
      this.emitDirect(result as O, trace, pending.enqueuedAt, startedAt, pending.merged);
    } else {
      this.startTask(pending.value, context, pending.seq, trace, result, kind, startedAt, pending.enqueuedAt, pending.merged);
    }
  }

  /**
   * A context, for work that can see one. The caller passes `trace` on with the outputs too: the
   * work may note decisions in it (callers write `contextFor(seq, (trace = traceOf(trace)))`).
   */
  private contextFor(seq: number, trace: TraceContext): WorkContext {
    return new WorkContext(this.name, seq, trace);
  }

  /** Runs the work; a throw is reported and yields FAILED. */
  private call(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): WorkResult<O> | typeof FAILED {
    // Between two linked stages no link scope is open (the emit is direct), so the hot path swaps nothing.
    if (currentLink() !== undefined) return this.callUnlinked(value, context, seq, trace, merged);
    let result: WorkResult<O>;
    try {
      result = this.work(value, context as WorkContext); // undefined only for work that cannot see it
    } catch (err) {
      this.workFailed(value, seq, trace, merged, err);
      return FAILED;
    }
    return this.terminated === true ? this.abandon(value, trace, seq, merged, result) : result;
  }

  /**
   * `call` for `async` functions, word for word: V8 keeps its feedback per call site,
   * shared by every stage, and async work seen at the site of sync work turns the call
   * of every sync stage into a generic one.
   */
  private callAsync(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): WorkResult<O> | typeof FAILED {
    if (currentLink() !== undefined) return this.callUnlinked(value, context, seq, trace, merged);
    let result: WorkResult<O>;
    try {
      result = this.work(value, context as WorkContext);
    } catch (err) {
      this.workFailed(value, seq, trace, merged, err);
      return FAILED;
    }
    return this.terminated === true ? this.abandon(value, trace, seq, merged, result) : result;
  }

  /** Flows the work subscribes for itself must not link to whoever is emitting to us (a plain operator upstream opened a scope). */
  private callUnlinked(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): WorkResult<O> | typeof FAILED {
    const scope = swapLink(undefined);
    let result: WorkResult<O>;
    try {
      result = this.work(value, context as WorkContext);
    } catch (err) {
      swapLink(scope);
      this.workFailed(value, seq, trace, merged, err);
      return FAILED;
    }
    swapLink(scope);
    return this.terminated === true ? this.abandon(value, trace, seq, merged, result) : result;
  }

  /**
   * The run ended while the work ran (the consumer left, or a kill switch aborted, from inside it):
   * the element is accounted for as its buffered peers were, and a result still to come is let go.
   */
  private abandon(value: I, trace: TraceRef, seq: number, merged: number, result: WorkResult<O>): typeof FAILED {
    if (this.cancelled === true) this.shed(value, trace, seq, 'cancelled', 1 + merged);
    else this.stats.failed += 1 + merged;
    const kind = kindOf(result);
    if (kind === PROMISE)
      (result as PromiseLike<O>).then(undefined, () => {}); // a late rejection has no one to tell
    else if (kind === ASYNC_ITERABLE)
      (result as AsyncIterable<O>)
        [Symbol.asyncIterator]()
        .return?.()
        ?.then(undefined, () => {});
    return FAILED;
  }

  /** When work on a sampled element straight from upstream starts: the upstream stage's exit time (one clock read per hop). */
  private startTime(trace: TraceContext): number {
    return trace.lastExit > 0 ? trace.lastExit : this.now();
  }

  /** `emitDirect` for an element straight from upstream (nothing merged, never buffered): fewer arguments on the hop. */
  private emitNow(output: O, trace: TraceRef, startedAt: number): void {
    this.passed++;
    if (isSampled(trace)) this.recordDirect(trace, -1, startedAt, 0);
    this.outlet.nextTraced(output, trace);
  }

  private emitDirect(output: O, trace: TraceRef, enqueuedAt: number, startedAt: number, merged: number): void {
    this.passed++;
    if (merged !== 0) this.stats.deliveredCount += merged;
    if (isSampled(trace)) this.recordDirect(trace, enqueuedAt, startedAt, merged);
    this.outlet.nextTraced(output, trace);
  }

  private recordDirect(trace: TraceContext, enqueuedAt: number, startedAt: number, merged: number): void {
    const end = this.now();
    this.record(trace, enqueuedAt >= 0 ? startedAt - enqueuedAt : 0, end - startedAt, 0, merged);
    trace.lastExit = end;
  }

  private startTask(
    value: I,
    context: WorkContext | undefined,
    seq: number,
    trace: TraceRef,
    result: WorkResult<O>,
    kind: number,
    startedAt: number,
    enqueuedAt: number,
    merged: number,
  ): void {
    if (kind === PROMISE && this.spare !== undefined && this.plainPromises === true && !isSampled(trace) && merged === 0 && result instanceof Promise) {
      this.startPromise(this.spare, value, context, seq, trace, result); // a Promise from a function that is not `async`
      return;
    }
    // Outputs of one element share its context: work with many (an Observable, an AsyncIterable) makes it now (see `TraceRef`).
    if (kind >= OBSERVABLE) trace = traceOf(trace);
    const task = this.taskFor(value, context, seq, trace, merged);
    if (isSampled(trace)) {
      task.startedAt = startedAt;
      task.queueWait = enqueuedAt >= 0 ? startedAt - enqueuedAt : 0;
    }
    this.inFlight++;
    if (this.ordered === true) this.append(task);
    else this.link(task);
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
    task.subscription = withLink(task, () =>
      result.subscribe({
        next: (output) => this.taskOutput(task, output),
        error: (err: unknown) => this.taskFailed(task, err),
        complete: () => this.taskDone(task),
      }),
    );
    if (task.closed) task.subscription.unsubscribe();
  }

  private taskFor(value: I, context: WorkContext | undefined, seq: number, trace: TraceRef, merged: number): Task<I, O> {
    const task = this.spare;
    if (task === undefined) return new Task<I, O>(this, value, context, seq, trace, merged, this.plainPromises);
    this.spare = task.after;
    task.reuse(value, context, seq, trace, merged, this.plainPromises);
    return task;
  }

  /** A Promise result settled (called by `Task.fulfilled`). */
  taskFulfilled(task: Task<I, O>, output: O): void {
    if (task.closed === true) return;
    // The oldest task settled with its one output, nothing being delivered, downstream wanting it: out at once.
    if (this.wip === 0 && task.quick === true && this.firstTask === task && this.outlet.wantsSettled() === true) {
      this.deliverSettled(task, output);
      return;
    }
    task.push(output);
    this.taskDone(task);
  }

  /**
   * `taskFulfilled`'s shortcut: what `drain` would do for this task, then the drain for the rest.
   * The task is retired before its output is emitted: nothing after the emit reads it, so the
   * emit's inlined code ends the hop. A consumer that leaves during the emit finds it
   * delivered, as it is; a second call of a misbehaving thenable finds it closed.
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
    // subscription, iterator or timer to close): `nextSettled` does not look again (−11 instructions).
    this.outlet.nextSettled(output, trace);
    this.wip = 0;
    // Nothing buffered and no task behind this one with something to deliver (a stage keeping up): the drain would
    // only ask upstream for more. (A counter, not a look at the next task: at concurrency 16 that task's memory is
    // seldom in cache, and reading it cost 1.6 cache misses per settle.)
    if (this.buffer.length !== 0 || this.upstreamDone === true || this.readyBehind !== 0) this.drain();
    else if (this.inlet.starving === true && this.terminated === false) this.askMore(); // a slot was just freed: the room is not 0, no pause to count
  }

  /** Out of line: a task `deliverSettled` cannot spare. */
  private closeSettled(task: Task<I, O>): void {
    task.done = true;
    this.closeTask(task);
  }

  private pullIterator(task: Task<I, O>): void {
    const iterator = task.iterator!;
    if (task.iterating || task.done || task.closed) return;
    task.iterating = true;
    iterator.next().then(
      (step) => {
        task.iterating = false;
        if (task.closed) return;
        if (step.done) this.taskDone(task);
        else this.taskOutput(task, step.value);
      },
      (err: unknown) => {
        task.iterating = false;
        this.taskFailed(task, err);
      },
    );
  }

  private taskOutput(task: Task<I, O>, output: O): void {
    if (task.closed === true) return;
    task.push(output);
    this.ready(task);
  }

  private taskDone(task: Task<I, O>): void {
    if (task.closed === true || task.done === true) return;
    task.done = true;
    if (task.timer !== undefined) {
      task.timer.unsubscribe();
      task.timer = undefined;
    }
    this.ready(task);
  }

  /** Work failed: thrown, rejected (`Task.rejected`), errored, or timed out. */
  taskFailed(task: Task<I, O>, err: unknown): void {
    if (task.closed || task.failed) return;
    const error = err instanceof SluiceError ? err : new StageError(this.config.name, task.seq, err);
    if (this.config.errorPolicy === 'fail') {
      this.fail(error);
      return;
    }
    task.failed = true;
    task.done = true;
    this.closeTask(task);
    // Counted when it leaves its slot (`retire`): ordered, it may wait for its turn, still in flight.
    callHook(this.config.onFailure, { stage: this.config.name, error, value: task.value, seq: task.seq, trace: traceOf(task.trace) });
    this.ready(task);
  }

  private workFailed(value: I, seq: number, trace: TraceRef, merged: number, err: unknown): void {
    // Typed errors pass as they are, thrown or rejected alike: callers match on their code.
    const error = err instanceof SluiceError ? err : new StageError(this.config.name, seq, err);
    this.stats.failed += 1 + merged;
    if (this.config.errorPolicy === 'fail') {
      this.fail(error);
      return;
    }
    callHook(this.config.onFailure, { stage: this.config.name, error, value, seq, trace: traceOf(trace) });
  }

  private ready(task: Task<I, O>): void {
    if (this.ordered === false) {
      if (task.queued === false) {
        task.queued = true;
        this.queue.push(task);
      }
    } else if (task.queued === false && task !== this.firstTask) {
      task.queued = true; // ordered: marked once, until retired (see `readyBehind`)
      this.readyBehind++;
    }
    this.drain();
  }

  /** The drain loop: deliver, start work, finish; then ask upstream for more. Never re-entered. */
  private drain(): void {
    if (this.wip++ !== 0) return;
    do {
      // Each delivery pass runs until it is blocked; only work started since can unblock it at once.
      do {
        if (this.ordered === true) this.deliverOrdered();
        else this.deliverUnordered();
      } while (this.terminated === false && this.startBuffered() === true && this.hasReady() === true);
      if (this.terminated === true) {
        this.wip = 0;
        return;
      }
      if (this.upstreamDone === true && this.buffer.length === 0 && this.inFlight === 0) {
        this.wip = 0;
        this.finish();
        return;
      }
    } while (--this.wip !== 0);
    if (this.upstreamDone === false) this.askMore();
  }

  /** After a drain: resume producers that stopped for lack of room if there is enough of it now (see `resumeAt`). */
  private askMore(): void {
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

  /** Something to deliver: ordered, the oldest task has an output or is done; unordered, any queued task. */
  private hasReady(): boolean {
    if (this.ordered === false) return this.queue.length !== 0;
    const head = this.firstTask;
    return head !== undefined && (head.outputs > 0 || head.done === true);
  }

  private deliverOrdered(): void {
    for (let task = this.firstTask; task !== undefined && this.terminated === false; task = this.firstTask) {
      if (task.outputs > 0) {
        if (this.emitFrom(task) === false) return;
      } else if (task.done === true) {
        this.dropOldest(task);
        this.retire(task);
      } else {
        return;
      }
    }
  }

  private deliverUnordered(): void {
    for (let task = this.queue.peek(); task !== undefined && !this.terminated; task = this.queue.peek()) {
      if (task.outputs > 0) {
        if (this.emitFrom(task) === false) return;
      } else {
        this.queue.shift();
        task.queued = false;
        if (task.done) this.retire(task);
      }
    }
  }

  /** Emits one output of `task` if downstream wants it; returns whether it did. */
  private emitFrom(task: Task<I, O>): boolean {
    if (this.outlet.wants() === false) {
      if (isSampled(task.trace) && task.waitingSince < 0) task.waitingSince = this.now();
      return false;
    }
    const output = task.shift();
    this.stats.emittedCount++;
    // Most tasks yield one output, unsampled: nothing more to do here (the rest is out of line, off the hop's inlined code).
    if (isSampled(task.trace) || (task.outputs === 0 && task.done === false)) this.emittedFrom(task);
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
      if (task.kept === undefined && task.recorded === false && (task.outputs > 0 || task.done === false)) this.placeRecord(task);
    }
    if (task.outputs > 0) return;
    if (task.done === false) {
      if (task.iterator) this.pullIterator(task);
      else if (task.subscription) task.resumeProducers();
    } else if (isSampled(task.trace)) {
      this.finishRecord(task); // the last output carries the complete record downstream
    }
  }

  /** Finished, and its last output already went downstream (the consumer may end the run while taking it). */
  private delivered(task: Task<I, O>): boolean {
    return task.done && task.outputs === 0;
  }

  private retire(task: Task<I, O>): void {
    if (task.queued === true) {
      task.queued = false; // ordered (unordered tasks leave the queue unmarked)
      this.readyBehind--;
    }
    this.inFlight--;
    if (this.ordered === false) this.unlink(task);
    if (task.reusable === false) this.closeTask(task);
    if (task.failed === false) this.stats.deliveredCount += 1 + task.merged;
    else this.stats.failed += 1 + task.merged;
    if (isSampled(task.trace)) this.finishRecord(task);
    if (task.reusable === true) this.spareTask(task);
  }

  /** A retired reusable task waits for a later element (closing it is the flag alone: it never had a timer, subscription or iterator). */
  private spareTask(task: Task<I, O>): void {
    task.closed = true;
    task.value = undefined as I; // the element's data is not held while the task waits
    task.after = this.spare;
    this.spare = task;
  }

  /** Ordered: `task` starts after every task in flight (a retired task's `after` was reset by `restart` or `reuse`). */
  private append(task: Task<I, O>): void {
    if (this.lastTask === undefined) this.firstTask = task;
    else this.lastTask.after = task;
    this.lastTask = task;
  }

  /** Ordered: the oldest task, `task`, leaves the list (before `spareTask` reuses its `after`). */
  private dropOldest(task: Task<I, O>): void {
    const next = task.after;
    this.firstTask = next;
    if (next === undefined) this.lastTask = undefined;
  }

  /** Unordered: `task` joins the list of tasks in flight. */
  private link(task: Task<I, O>): void {
    task.before = this.lastTask;
    if (this.lastTask === undefined) this.firstTask = task;
    else this.lastTask.after = task;
    this.lastTask = task;
  }

  private unlink(task: Task<I, O>): void {
    if (task.before === undefined) this.firstTask = task.after;
    else task.before.after = task.after;
    if (task.after === undefined) this.lastTask = task.before;
    else task.after.before = task.before;
  }

  /** Every task in flight, oldest first (for cancel and fail). */
  private tasksInFlight(): Task<I, O>[] {
    const tasks: Task<I, O>[] = [];
    for (let task = this.firstTask; task !== undefined; task = task.after) tasks.push(task);
    return tasks;
  }

  private finishRecord(task: Task<I, O>): void {
    if (task.recorded === true) return;
    task.recorded = true;
    const trace = task.trace;
    if (!isSampled(trace)) return; // only sampled tasks are recorded
    const end = this.now();
    const kept = task.kept;
    if (kept === undefined) {
      this.record(trace, task.queueWait, end - task.startedAt - task.paused, task.paused, task.merged);
    } else {
      task.kept = undefined;
      trace.amend(kept, end - task.startedAt - task.paused, task.paused, this.retries(trace));
    }
    trace.lastExit = end;
  }

  /** Keeps a streaming task's record in stage order: placed as its first output leaves, with the times so far. */
  private placeRecord(task: Task<I, O>): void {
    const trace = task.trace as TraceContext;
    const retries = this.retries(trace);
    task.kept = trace.keep(this.name, task.queueWait, this.now() - task.startedAt - task.paused, task.paused, retries, task.merged, undefined);
  }

  private record(trace: TraceContext, queueWait: number, service: number, paused: number, conflated: number): void {
    const retries = this.retries(trace);
    trace.keep(this.name, queueWait, service, paused, retries, conflated, undefined);
  }

  /** Retry wrappers note their attempts; a record carries them so timing and retries read together. */
  private retries(trace: TraceContext): number {
    const notes = trace.notes;
    if (notes === undefined) return 0;
    const retries = notes[`${this.name}.retries`];
    return typeof retries === 'number' ? retries : 0;
  }

  private shed(value: I, trace: TraceRef, seq: number, reason: ShedReason, count: number, kept?: Kept): void {
    this.stats.shed[reason] += count;
    if (isSampled(trace)) {
      if (kept === undefined) trace.keep(this.name, 0, 0, 0, 0, 0, reason);
      else trace.amend(kept, kept.service, kept.paused, kept.retries, reason);
    }
    if (this.config.onShed !== undefined) callHook(this.config.onShed, { stage: this.config.name, reason, value, seq, trace: traceOf(trace), count });
  }

  private closeTask(task: Task<I, O>): void {
    if (task.closed) return;
    task.closed = true;
    task.timer?.unsubscribe();
    task.timer = undefined;
    task.subscription?.unsubscribe();
    if (task.iterator && !task.done) {
      task.iterator.return?.().then(undefined, () => {});
    }
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

  private finish(): void {
    this.terminated = true;
    this.hop = false;
    this.releaseAll();
    if (this.pendingError) this.outlet.error(this.pendingError.error);
    else this.outlet.complete();
  }

  /** Ends the stream now with `error`: in-flight work is aborted and it and the buffer count as failed. */
  private fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    this.hop = false;
    this.upstream?.unsubscribe();
    let lost = 0;
    for (const pending of this.takeBuffered()) lost += 1 + pending.merged;
    for (const task of this.tasksInFlight()) {
      task.context?.abort(error);
      this.closeTask(task);
      if (task.failed) lost += 1 + task.merged;
      else if (this.delivered(task)) this.stats.deliveredCount += 1 + task.merged;
      else lost += 1 + task.merged;
    }
    this.stats.failed += lost;
    this.releaseAll();
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

  private releaseAll(): void {
    this.takeBuffered();
    this.inFlight = 0;
    this.stats.untrack(this);
    this.firstTask = this.lastTask = this.spare = undefined;
    this.upstream?.unsubscribe();
    this.drainTimer?.unsubscribe();
    this.drainTimer = undefined;
    this.inlet.close();
    this.stopKillListener?.();
    this.stopKillListener = undefined;
  }
}

export function describeValue(value: unknown): string {
  return value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value;
}

export function describe(reason: unknown): string {
  return reason instanceof Error ? reason.message : String(reason);
}
