/**
 * A connection's running requests by id. The first is held in a field, any others in a Map made
 * for them: a Map that gains and loses its one entry per request makes a new table each time, and
 * that table, held by a long-lived connection, was promoted with every request (~100 bytes each).
 */
export class StreamTable<S extends { readonly id: string }> {
  private first: S | undefined;
  private rest: Map<string, S> | undefined;

  get size(): number {
    return (this.first === undefined ? 0 : 1) + (this.rest === undefined ? 0 : this.rest.size);
  }

  get(id: string): S | undefined {
    if (this.first !== undefined && this.first.id === id) return this.first;
    return this.rest?.get(id);
  }

  has(id: string): boolean {
    return this.get(id) !== undefined;
  }

  /** Adds `stream` (its id must not be in the table). */
  add(stream: S): void {
    if (this.first === undefined) this.first = stream;
    else (this.rest ??= new Map()).set(stream.id, stream);
  }

  delete(id: string): void {
    if (this.first !== undefined && this.first.id === id) this.first = undefined;
    else this.rest?.delete(id);
  }

  /** The one stream when there is exactly one, without making an array. */
  single(): S | undefined {
    if (this.size !== 1) return undefined;
    return this.first ?? this.rest!.values().next().value;
  }

  /** A copy, so the caller may end streams while it goes through them. */
  values(): S[] {
    const all: S[] = this.first === undefined ? [] : [this.first];
    if (this.rest !== undefined) for (const stream of this.rest.values()) all.push(stream);
    return all;
  }
}
