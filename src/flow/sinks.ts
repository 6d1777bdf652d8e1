/**
 * Sinks that keep backpressure: where results leave a pipeline for a Node Writable or a
 * `for await` loop, pulled only as fast as that consumer takes them. The mirror image of
 * `sources.ts`: both ends pause, so a pipeline holds a bounded number of elements end to end.
 *
 * Sinks deliver the elements they get, as they are. A stage emits `Traced<T>`: end the
 * pipeline with `untraced()` to write or iterate the payloads.
 *
 * The bounds hold for sources that speak demand (Flows, and plain operators over them). A
 * plain Observable pushes whether asked or not, and a sink never drops what it was given:
 * put such a source through `fromPush` (a policy) or a stage first.
 */
import { finished, type Writable } from 'node:stream';
import { lazySchema } from '../core/zod.js';
import { Observable, Subscriber, type OperatorFunction } from 'rxjs';
import { subscribeWithDemand, type DemandSubscription } from './demand.js';
import { parseOptions, positiveInt } from './options.js';
import { Ring } from './ring.js';
import { InvalidOptionsError, SluiceError } from '../core/errors.js';
import type { Traced } from '../core/trace.js';
import { type Settlement, forEachSettlement } from '../core/settlement.js';

/** Something else ended the writable before the source completed: what the source had left was not written. */
export class WritableClosedError extends SluiceError {
  constructor() {
    super('WRITABLE_CLOSED', 'The writable finished before the source completed.', {
      hint: 'Let toWritable end the writable it was given; to write several sources into one writable, pass { end: false }.',
    });
  }
}

/** A second `for await` over one `toAsyncIterable` result. */
export class AlreadyIteratedError extends SluiceError {
  constructor() {
    super('ALREADY_ITERATED', 'This toAsyncIterable() result was already iterated: each one runs its source once.', {
      hint: 'Call toAsyncIterable(source) again to run the pipeline again.',
    });
  }
}

/**
 * Leaves the `Traced` envelope: the payloads of a stage's outputs, for sinks and plain
 * consumers that want values. Like a plain synchronous `map`, demand passes through it
 * (read what you need from the trace before it, in a `tap` or a stage).
 *
 * It ends the traced part of a pipeline: each element counts as delivered once the consumer
 * after it took it, so an element from a link (`sluice/nats`) is acknowledged there.
 *
 * ```ts
 * await toWritable(fromIterable(lines).pipe(stage(translate), untraced()), file);
 * ```
 */
export function untraced<T>(): OperatorFunction<Traced<T>, T> {
  return (source) =>
    new Observable<T>((subscriber) => {
      const leaving = new Leaving(subscriber);
      subscriber.add(leaving); // before subscribing: a synchronous source stops as soon as the consumer leaves
      source.subscribe(leaving);
    });
}

/** Hands on each payload, then counts the element delivered. */
class Leaving<T> extends Subscriber<Traced<T>> {
  constructor(private readonly consumer: Subscriber<T>) {
    super();
  }
  protected override _next(element: Traced<T>): void {
    this.consumer.next(element.value);
    forEachSettlement(element.value, element.trace.settlement, deliver);
  }
  protected override _error(error: unknown): void {
    this.unsubscribe();
    this.consumer.error(error);
  }
  protected override _complete(): void {
    this.unsubscribe();
    this.consumer.complete();
  }
}

function deliver(settlement: Settlement): void {
  settlement.deliver();
}

/** Options of `toWritable`. */
export interface ToWritableOptions {
  /**
   * Elements asked of the source ahead of the writable. Default: the writable's
   * `writableHighWaterMark` in object mode (its own measure of how much it may hold), else 16
   * (a byte-mode high-water mark counts bytes, not elements).
   */
  highWaterMark?: number;
  /**
   * Whether the run owns the writable: ends it when the source completes and destroys it when
   * the run fails (default `true`). `false` leaves it open either way — `process.stdout`, or a
   * socket several runs write to; the promise then resolves once every write was flushed.
   */
  end?: boolean;
  /** Aborting cancels the source, destroys the writable (unless `end: false`) and rejects with `signal.reason`. */
  signal?: AbortSignal;
}

/** Options of `toAsyncIterable`. */
export interface ToAsyncIterableOptions {
  /** Elements held for the loop, asked for and buffered together (default 16). */
  highWaterMark?: number;
  /** Aborting cancels the source; the pending or next `next()` rejects with `signal.reason`. */
  signal?: AbortSignal;
}

const signalSchema = lazySchema((z) => z.instanceof(AbortSignal, { error: 'signal must be an AbortSignal' }));

const writableOptionsSchema = lazySchema((z) =>
  z
    .object({
      highWaterMark: positiveInt('highWaterMark').optional(),
      end: z.boolean({ error: 'end must be a boolean' }).default(true),
      signal: signalSchema().optional(),
    })
    .strict(),
);

/**
 * Writes before the sink lets the event loop turn. A source and a writable that both go on
 * synchronously (a generator, a write callback called at once) would otherwise hold the loop
 * for the whole run, and an abort, a 'close' or a timer could not be seen until it ended.
 */
const WRITES_PER_TURN = 1024;

const iterableOptionsSchema = lazySchema((z) =>
  z.object({ highWaterMark: positiveInt('highWaterMark').default(16), signal: signalSchema().optional() }).strict(),
);

/**
 * Writes every element of `source` to `writable`, pulling only what the writable can take:
 * no more is asked while `write()` returns false, until `'drain'`. Resolves once the source
 * completed and the writable finished (with `end: false`: once every write was flushed).
 *
 * Rejects with the first failure, and cleans up after it: an upstream error destroys the
 * writable with that error; a writable that errors or closes before finishing (or an abort)
 * cancels the source, so a generator's `finally` runs and a model call in flight is aborted.
 *
 * ```ts
 * await toWritable(fromIterable(prompts).pipe(stage(generate, { concurrency: 4 }), untraced()), socket);
 * ```
 *
 * A bad `source`, `writable` or option throws `InvalidOptionsError` at once, naming the field.
 */
export function toWritable<T>(source: Observable<T>, writable: Writable, options: ToWritableOptions = {}): Promise<void> {
  requireArgument('toWritable', 'source', source, isObservable, 'an Observable');
  requireArgument('toWritable', 'writable', writable, isWritable, 'a Node Writable (with write(), end() and on())');
  const { highWaterMark = defaultHighWaterMark(writable), end, signal } = parseOptions(writableOptionsSchema(), options, 'toWritable options');

  return new Promise<void>((resolve, reject) => {
    let subscription: DemandSubscription | undefined;
    let settled = false;
    let sourceDone = false;
    /** `write()` returned false: nothing more is asked until `'drain'`. */
    let blocked = writable.writableNeedDrain === true;
    /** `end: false` only: writes whose callback has not run yet. */
    let unflushed = 0;
    let writesThisTurn = 0;
    let turn: NodeJS.Immediate | undefined;

    const nextTurn = (): void => {
      turn = undefined;
      writesThisTurn = 0;
      refill();
    };
    const refill = (): void => {
      if (settled || blocked || sourceDone || subscription === undefined || turn !== undefined) return;
      if (writesThisTurn >= WRITES_PER_TURN) {
        turn = setImmediate(nextTurn);
        return;
      }
      // Asked for in halves: one request per half a mark rather than one per element.
      const outstanding = subscription.outstanding;
      if (outstanding <= highWaterMark / 2) subscription.request(highWaterMark - outstanding);
    };
    const onDrain = (): void => {
      blocked = false;
      refill();
    };
    const onAbort = (): void => fail(signal!.reason);
    // A write that failed is not counted as flushed: the writable's own error is reported by the watch below.
    const flushed = (error?: Error | null): void => {
      unflushed--;
      if (!error && sourceDone && unflushed === 0) succeed();
    };
    // One watch for every way the writable can end: finish, error, or close before finishing.
    const stopWatching = finished(writable, { readable: false }, (error) => {
      if (error) fail(error);
      else if (sourceDone) succeed();
      else fail(new WritableClosedError());
    });

    const settle = (): void => {
      settled = true;
      subscription?.cancel();
      writable.off('drain', onDrain);
      if (turn !== undefined) clearImmediate(turn);
      signal?.removeEventListener('abort', onAbort);
    };
    const succeed = (): void => {
      if (settled) return;
      settle();
      stopWatching();
      resolve();
    };
    function fail(error: unknown): void {
      if (settled) return;
      settle();
      // The watch stays on a writable destroyed here: it takes the 'error' event that follows.
      if (end && writable.destroyed !== true) writable.destroy(error as Error);
      else stopWatching();
      reject(error);
    }

    if (signal?.aborted) return fail(signal.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    writable.on('drain', onDrain);
    subscription = subscribeWithDemand(source, {
      next: (value) => {
        if (settled) return;
        let accepted: boolean;
        writesThisTurn++;
        try {
          if (end) accepted = writable.write(value);
          else {
            unflushed++;
            accepted = writable.write(value, flushed);
          }
        } catch (error) {
          return fail(error); // a byte-mode writable throws on a chunk that is not bytes
        }
        if (accepted) refill();
        else blocked = true;
      },
      error: (error) => fail(error),
      complete: () => {
        sourceDone = true;
        if (end) writable.end();
        else if (unflushed === 0) succeed();
      },
    });
    if (settled)
      subscription.cancel(); // failed while subscribing
    else refill();
  });
}

/**
 * The elements of `source` as an async iterable for `for await`: at most `highWaterMark` of
 * them are asked for ahead of the loop, so a slow loop body slows the pipeline instead of
 * filling memory. Leaving the loop (`break`, `return`, a throw) cancels the source; an
 * upstream error is thrown from the loop after the elements that came before it.
 *
 * The result is its own iterator, run once: the source is subscribed on the first `next()`,
 * and a second `[Symbol.asyncIterator]()` throws `AlreadyIteratedError` rather than quietly
 * yielding nothing or running the pipeline (and its model calls) again.
 *
 * ```ts
 * for await (const answer of toAsyncIterable(questions.pipe(stage(ask), untraced()), { highWaterMark: 4 })) {
 *   console.log(answer);
 * }
 * ```
 *
 * A bad `source` or option throws `InvalidOptionsError` at once, naming the field.
 */
export function toAsyncIterable<T>(source: Observable<T>, options: ToAsyncIterableOptions = {}): FlowIterator<T> {
  requireArgument('toAsyncIterable', 'source', source, isObservable, 'an Observable');
  const { highWaterMark, signal } = parseOptions(iterableOptionsSchema(), options, 'toAsyncIterable options');
  return new BufferedIterator(source, highWaterMark, signal);
}

/** What `toAsyncIterable` returns: an async iterator that is its own iterable, with `return` and `throw` always there. */
export interface FlowIterator<T> extends AsyncIterableIterator<T> {
  /** The next element, pulled from the flow only when asked for. */
  next(): Promise<IteratorResult<T, undefined>>;
  /** `break` in a `for await`: the source is cancelled and what was buffered is dropped. */
  return(): Promise<IteratorResult<T, undefined>>;
  /** Ends the run with `error`: the source is cancelled, and the error goes to a pending `next()`, else to this call. */
  throw(error?: unknown): Promise<IteratorResult<T, undefined>>;
  /** The iterator itself, once: a second call throws `AlreadyIteratedError`. */
  [Symbol.asyncIterator](): FlowIterator<T>;
}

interface Waiter<T> {
  resolve(result: IteratorResult<T, undefined>): void;
  reject(error: unknown): void;
}

/** How the run ended, delivered after the buffered elements: an error is seen once, then `done`. */
type End = 'done' | { readonly error: unknown };

class BufferedIterator<T> implements FlowIterator<T> {
  /** Invariant: `buffer.length + subscription.outstanding ≤ highWaterMark`, and no waiter while the buffer holds an element. */
  private readonly buffer: Ring<T>;
  /** `next()` calls made before their element arrived, answered in order. */
  private readonly waiting = new Ring<Waiter<T>>(2);
  private subscription: DemandSubscription | undefined;
  private end: End | undefined;
  private iterated = false;
  private readonly onAbort = (): void => this.close({ error: this.signal!.reason });

  constructor(
    private readonly source: Observable<T>,
    private readonly highWaterMark: number,
    private readonly signal: AbortSignal | undefined,
  ) {
    this.buffer = new Ring(Math.min(highWaterMark, 1024));
  }

  [Symbol.asyncIterator](): this {
    if (this.iterated) throw new AlreadyIteratedError();
    this.iterated = true;
    return this;
  }

  next(): Promise<IteratorResult<T, undefined>> {
    if (this.buffer.length > 0) {
      const value = this.buffer.shift() as T;
      this.refill();
      return Promise.resolve({ value, done: false });
    }
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject };
      if (this.end !== undefined) return this.answerEnd(waiter);
      this.waiting.push(waiter);
      if (this.subscription === undefined) this.start();
      else this.refill();
    });
  }

  return(): Promise<IteratorResult<T, undefined>> {
    this.close('done');
    return Promise.resolve({ value: undefined, done: true });
  }

  throw(error?: unknown): Promise<IteratorResult<T, undefined>> {
    this.close({ error });
    return new Promise((resolve, reject) => this.answerEnd({ resolve, reject }));
  }

  private start(): void {
    if (this.signal?.aborted) return this.close({ error: this.signal.reason });
    this.signal?.addEventListener('abort', this.onAbort, { once: true });
    const subscription = subscribeWithDemand(this.source, {
      next: (value) => this.arrive(value),
      error: (error) => this.finish({ error }),
      complete: () => this.finish('done'),
    });
    if (this.end !== undefined) return subscription.cancel(); // ended while subscribing
    this.subscription = subscription;
    this.refill();
  }

  private arrive(value: T): void {
    if (this.end !== undefined) return;
    const waiter = this.waiting.shift();
    if (waiter === undefined) return this.buffer.push(value);
    waiter.resolve({ value, done: false });
    this.refill();
  }

  private refill(): void {
    const subscription = this.subscription;
    if (subscription === undefined || this.end !== undefined) return;
    // Asked for in halves: one request per half a mark rather than one per element.
    const room = this.highWaterMark - this.buffer.length - subscription.outstanding;
    if (room >= Math.ceil(this.highWaterMark / 2)) subscription.request(room);
  }

  /** The source ended: the buffered elements go first, the end after them. */
  private finish(end: End): void {
    if (this.end !== undefined) return;
    this.end = end;
    this.signal?.removeEventListener('abort', this.onAbort);
    this.answerWaiting();
  }

  /** The consumer ended the run: the source is cancelled and the buffer dropped. */
  private close(end: End): void {
    this.subscription?.cancel();
    this.buffer.clear();
    this.end = undefined;
    this.finish(end);
  }

  private answerWaiting(): void {
    for (let waiter = this.waiting.shift(); waiter !== undefined; waiter = this.waiting.shift()) this.answerEnd(waiter);
  }

  private answerEnd(waiter: Waiter<T>): void {
    const end = this.end;
    if (typeof end === 'object') {
      this.end = 'done';
      waiter.reject(end.error);
    } else {
      waiter.resolve({ value: undefined, done: true });
    }
  }
}

function defaultHighWaterMark(writable: Writable): number {
  const mark = writable.writableObjectMode === true ? writable.writableHighWaterMark : undefined;
  return typeof mark === 'number' && mark >= 1 ? Math.floor(mark) : 16;
}

function isObservable(value: unknown): boolean {
  return typeof (value as Observable<unknown> | undefined)?.subscribe === 'function';
}

/** Duck-typed, as `stream.finished` does: writables from other stream libraries qualify too. */
function isWritable(value: unknown): boolean {
  const candidate = value as Partial<Writable> | undefined;
  return typeof candidate?.write === 'function' && typeof candidate.end === 'function' && typeof candidate.on === 'function';
}

function requireArgument(what: string, path: string, value: unknown, valid: (value: unknown) => boolean, expected: string): void {
  if (valid(value)) return;
  const got = value === null ? 'null' : typeof value === 'object' ? (value.constructor?.name ?? 'an object') : typeof value;
  throw new InvalidOptionsError(what, [{ path, message: `must be ${expected}, got ${got}` }]);
}
