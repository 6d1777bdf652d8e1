/**
 * A pure function of a text, remembered for the texts used most recently. The passages of a
 * corpus come back in question after question, so what is worked out from a passage's text (its
 * sentences, their indexed terms, a word's stem) is per corpus, not per question: computed once,
 * then looked up.
 */

/** Remembers `compute(text)` for the last `capacity` texts used; `compute` must be pure. */
export class TextMemo<T> {
  readonly capacity: number;
  private readonly entries = new Map<string, T>();

  /** `capacity`: texts remembered at most (a positive integer); the least recently used is forgotten first. */
  constructor(
    private readonly compute: (text: string) => T,
    capacity: number,
  ) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${String(capacity)}`);
    this.capacity = capacity;
  }

  /** Texts remembered now. */
  get size(): number {
    return this.entries.size;
  }

  /** `compute(text)`, computed now or remembered; the value is shared between callers, so it must not be mutated. */
  get(text: string): T {
    const entries = this.entries;
    const known = entries.get(text);
    if (known !== undefined || entries.has(text)) {
      // Re-inserted, it becomes the last key: the first key is always the least recently used.
      entries.delete(text);
      entries.set(text, known as T);
      return known as T;
    }
    const value = this.compute(text);
    entries.set(text, value);
    if (entries.size > this.capacity) entries.delete(entries.keys().next().value as string);
    return value;
  }
}
