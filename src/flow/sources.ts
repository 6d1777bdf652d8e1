/**
 * Sources that can be paused: they produce only while their consumer wants more.
 * A 10M-element generator into a slow stage holds at most the stage's capacity.
 */
import type { Readable } from 'node:stream';
import { Flow, type Outlet, type Producer } from './demand.js';

/**
 * A Flow over a synchronous iterable or generator, pulled one element per unit of
 * demand. Subscribed plainly it emits synchronously, like RxJS `from(array)`. An array
 * (or typed array) completes with its last element, since its end is known; any other
 * iterator is known to be done only when asked for one more element, so it completes
 * when demand asks again (a generator never runs ahead of demand).
 *
 * ```ts
 * fromIterable(function* () { for (let i = 0; ; i++) yield i; }())  // infinite, yet bounded memory
 * ```
 */
export function fromIterable<T>(iterable: Iterable<T>): Flow<T> {
  if (Array.isArray(iterable) || ArrayBuffer.isView(iterable)) return new Flow<T>((outlet) => new ArrayProducer(iterable as unknown as ArrayLike<T>, outlet));
  return new Flow<T>((outlet) => new IterableProducer(iterable, outlet));
}

class ArrayProducer<T> implements Producer {
  private index = 0;
  constructor(
    private readonly array: ArrayLike<T>,
    private readonly outlet: Outlet<T>,
  ) {}

  pull(): void {
    const { array, outlet } = this;
    try {
      // The end is known without asking: complete with (or right after) the last element, demand or not.
      while (this.index < array.length && outlet.wants() === true) outlet.next(array[this.index++]!);
      if (this.index >= array.length && !outlet.closed) outlet.complete();
    } catch (err) {
      outlet.error(err);
    }
  }

  cancel(): void {
    this.index = Infinity;
  }
}

class IterableProducer<T> implements Producer {
  private iterator: Iterator<T> | undefined;
  constructor(
    private readonly iterable: Iterable<T>,
    private readonly outlet: Outlet<T>,
  ) {}

  pull(): void {
    const outlet = this.outlet;
    try {
      const iterator = (this.iterator ??= this.iterable[Symbol.iterator]());
      while (outlet.wants() === true) {
        const step = iterator.next();
        if (step.done === true) {
          this.iterator = undefined;
          outlet.complete();
          return;
        }
        outlet.next(step.value);
      }
    } catch (err) {
      this.iterator = undefined;
      outlet.error(err);
    }
  }

  cancel(): void {
    const iterator = this.iterator;
    this.iterator = undefined;
    try {
      iterator?.return?.();
    } catch {
      // the consumer is gone; a generator's finally block failing has no one to tell
    }
  }
}

/** A Flow over an async iterable: `next()` is called only when there is demand, one at a time. */
export function fromAsyncIterable<T>(iterable: AsyncIterable<T>): Flow<T> {
  return new Flow<T>((outlet) => new AsyncIterableProducer(iterable, outlet));
}

class AsyncIterableProducer<T> implements Producer {
  private iterator: AsyncIterator<T> | undefined;
  private waiting = false;
  private done = false;

  constructor(
    private readonly iterable: AsyncIterable<T>,
    private readonly outlet: Outlet<T>,
  ) {}

  pull(): void {
    if (this.waiting || this.done || !this.outlet.wants()) return;
    let iterator: AsyncIterator<T>;
    try {
      iterator = this.iterator ??= this.iterable[Symbol.asyncIterator]();
    } catch (err) {
      this.done = true;
      this.outlet.error(err);
      return;
    }
    this.waiting = true;
    iterator.next().then(this.onStep, this.onError);
  }

  // Bound once, not per element: two closures per `next()` were most of what a source allocated.
  private readonly onStep = (step: IteratorResult<T>): void => {
    this.waiting = false;
    if (this.done) return;
    if (step.done) {
      this.done = true;
      this.outlet.complete();
      return;
    }
    this.outlet.next(step.value);
    this.pull();
  };

  private readonly onError = (err: unknown): void => {
    this.waiting = false;
    if (this.done) return;
    this.done = true;
    this.outlet.error(err);
  };

  cancel(): void {
    if (this.done) return;
    this.done = true;
    this.iterator?.return?.().then(undefined, () => {});
  }
}

/**
 * A Flow over a Node Readable in paused mode: `read()` is called only while there is
 * demand; when the stream has nothing buffered it waits for `readable`. Object mode
 * yields objects; byte mode yields Buffers (or strings with an encoding set).
 */
export function fromReadable<T = Buffer>(readable: Readable): Flow<T> {
  return new Flow<T>((outlet) => new ReadableProducer<T>(readable, outlet));
}

/**
 * Reads before the producer lets `process.nextTick` callbacks run. Each `read()` may queue one
 * (the stream's `readable` bookkeeping), and a pipeline whose stages settle in microtasks never
 * lets the tick queue drain: without a yield the queued ticks grow with the input.
 */
const READS_PER_TICK = 1024;

class ReadableProducer<T> implements Producer {
  private ended = false;
  private reads = 0;
  private yielding = false;
  private readonly onTick = (): void => {
    this.yielding = false;
    this.reads = 0;
    this.pull();
  };
  private readonly onReadable = (): void => this.pull();
  private readonly onEnd = (): void => this.finish();
  private readonly onError = (err: unknown): void => {
    if (this.ended) return;
    this.detach();
    this.outlet.error(err);
  };

  constructor(
    private readonly readable: Readable,
    private readonly outlet: Outlet<T>,
  ) {}

  start(): void {
    this.readable.pause();
    this.readable.on('readable', this.onReadable);
    this.readable.on('end', this.onEnd);
    this.readable.on('error', this.onError);
    if (this.readable.readableEnded) this.finish();
  }

  pull(): void {
    while (!this.ended && this.outlet.wants()) {
      if (this.reads >= READS_PER_TICK) {
        this.yieldToTicks();
        return;
      }
      const chunk = this.readable.read() as T | null;
      if (chunk === null) return; // 'readable' (or 'end') calls us again
      this.reads++;
      this.outlet.next(chunk);
    }
  }

  /** Goes on once the tick queue has run (after the microtasks in flight drain). */
  private yieldToTicks(): void {
    if (this.yielding) return;
    this.yielding = true;
    process.nextTick(this.onTick);
  }

  private finish(): void {
    if (this.ended) return;
    this.detach();
    this.outlet.complete();
  }

  private detach(): void {
    this.ended = true;
    this.readable.off('readable', this.onReadable);
    this.readable.off('end', this.onEnd);
    this.readable.off('error', this.onError);
  }

  cancel(): void {
    if (this.ended) return;
    this.detach();
    this.readable.destroy();
  }
}
