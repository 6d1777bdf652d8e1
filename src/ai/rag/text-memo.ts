/**
 * A pure function of a text, remembered for the texts used recently. The passages of a corpus
 * come back in question after question, so what is worked out from a passage's text (its
 * sentences, their indexed terms, a word's stem) is per corpus, not per question: computed once,
 * then looked up.
 *
 * Two generations of `capacity` texts each, as quick-lru keeps them: texts go into the young one;
 * when it is full it becomes the old one and the old one is dropped; a text found in the old one
 * moves back into the young one. A hit costs one or two `Map` lookups: refreshing an exact LRU
 * order on every hit (a delete and a set) cost more than the lookups it saves here.
 */

/** Remembers `compute(text)` for the texts used recently; `compute` must be pure. */
export class TextMemo<T> {
  readonly capacity: number;
  private young = new Map<string, T>();
  private old = new Map<string, T>();

  /**
   * `capacity` (a positive integer): texts per generation. A text used within the last `capacity`
   * texts added is always remembered; at most 2 × `capacity` texts are held.
   */
  constructor(
    private readonly compute: (text: string) => T,
    capacity: number,
  ) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new RangeError(`capacity must be a positive integer, got ${String(capacity)}`);
    this.capacity = capacity;
  }

  /** Texts held now. */
  get size(): number {
    return this.young.size + this.old.size;
  }

  /** `compute(text)`, computed now or remembered; the value is shared between callers, so it must not be mutated. */
  get(text: string): T {
    const young = this.young.get(text);
    if (young !== undefined || this.young.has(text)) return young as T;
    const old = this.old.get(text);
    const known = old !== undefined || this.old.has(text);
    if (known) this.old.delete(text);
    const value = known ? (old as T) : this.compute(text);
    this.add(text, value);
    return value;
  }

  private add(text: string, value: T): void {
    if (this.young.size >= this.capacity) {
      this.old = this.young;
      this.young = new Map();
    }
    this.young.set(text, value);
  }
}
