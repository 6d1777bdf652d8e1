/**
 * A bounded FIFO ring buffer with O(1) push/shift (RxJS's `mergeInternals` uses
 * `Array.prototype.shift()`, which is O(n) per element).
 *
 * `push` beyond `capacity` grows the backing store: callers that promise a bound
 * check `length` against their capacity before pushing; growth exists only so a
 * bounded overshoot (documented where it can happen) never loses an element.
 */
export class Ring<T> {
  private items: (T | undefined)[];
  private head = 0;
  private size = 0;

  constructor(initialCapacity = 16) {
    this.items = new Array<T | undefined>(Math.max(2, initialCapacity));
  }

  get length(): number {
    return this.size;
  }

  push(item: T): void {
    if (this.size === this.items.length) this.grow();
    this.items[this.index(this.size)] = item;
    this.size++;
  }

  shift(): T | undefined {
    if (this.size === 0) return undefined;
    const item = this.items[this.head];
    this.items[this.head] = undefined; // let the element be collected
    this.head = this.head + 1 === this.items.length ? 0 : this.head + 1;
    this.size--;
    return item;
  }

  /** `shift` when the caller holds the oldest element already (it is there: `length > 0`). */
  dropFirst(): void {
    const head = this.head;
    this.items[head] = undefined;
    this.head = head + 1 === this.items.length ? 0 : head + 1;
    this.size--;
  }

  clear(): void {
    this.items.fill(undefined);
    this.head = 0;
    this.size = 0;
  }

  peek(): T | undefined {
    return this.size === 0 ? undefined : this.items[this.head];
  }

  /** The element `index` places from the oldest (0 is the oldest). */
  at(index: number): T | undefined {
    return index < 0 || index >= this.size ? undefined : this.items[this.index(index)];
  }

  peekLast(): T | undefined {
    return this.size === 0 ? undefined : this.items[this.index(this.size - 1)];
  }

  /** Replaces the newest element (used by conflation). */
  replaceLast(item: T): void {
    if (this.size === 0) throw new RangeError('Ring is empty');
    this.items[this.index(this.size - 1)] = item;
  }

  /** Removes and returns the newest element. */
  pop(): T | undefined {
    if (this.size === 0) return undefined;
    const index = this.index(this.size - 1);
    const item = this.items[index];
    this.items[index] = undefined;
    this.size--;
    return item;
  }

  /** Removes every element, returning them oldest first. */
  drain(): T[] {
    const out: T[] = [];
    while (this.size > 0) out.push(this.shift() as T);
    return out;
  }

  /** The slot of the element `offset` places from the oldest (`offset` < capacity): a wrap, not a `%` (an integer division on the hot path). */
  private index(offset: number): number {
    const slot = this.head + offset;
    return slot >= this.items.length ? slot - this.items.length : slot;
  }

  private grow(): void {
    const next = new Array<T | undefined>(this.items.length * 2);
    for (let i = 0; i < this.size; i++) next[i] = this.items[this.index(i)];
    this.items = next;
    this.head = 0;
  }
}
