/**
 * The corpus's passages as word-vector meanings (`WordVectors`), each centred on the corpus's
 * mean: what every passage shares (the register of technical prose) is taken out, so that how close
 * a question comes to its nearest passage says whether the corpus speaks of what it asks, in other
 * words than the question's if need be.
 */
import type { WordVectors } from './word-vectors.js';

/** A passage as the index reads it. */
export interface MeaningPassage {
  /** How `search` names it; a passage without one is evidence for `best` only. */
  readonly id?: string;
  readonly text: string;
  /** Its heading path: part of what it is about. */
  readonly headings?: string;
}

/** Passages' word-vector meanings, centred on their mean: how close a question comes to the nearest one (`best`). */
export class MeaningIndex {
  private constructor(
    private readonly vectors: WordVectors,
    /** The corpus's mean meaning. */
    private readonly mean: Float32Array,
    /** Each passage's centred, unit-length meaning, row by row. */
    private readonly rows: Float32Array,
    /** Passages indexed. */
    readonly size: number,
    private readonly rowOf: ReadonlyMap<string, number>,
  ) {}

  /** The meanings of `passages` (their headings and text), centred on theirs. */
  static of(passages: Iterable<MeaningPassage>, vectors: WordVectors): MeaningIndex {
    const dim = vectors.dim;
    const list = [...passages];
    const rowOf = new Map(list.flatMap((p, row) => (p.id === undefined ? [] : [[p.id, row] as const])));
    const meanings = list.map((p) => unit(vectors.embed(p.headings === undefined ? p.text : `${p.headings}\n${p.text}`)));
    const mean = new Float32Array(dim);
    for (const m of meanings) for (let i = 0; i < dim; i++) mean[i]! += m[i]! / meanings.length;
    const rows = new Float32Array(meanings.length * dim);
    for (const [row, m] of meanings.entries()) {
      for (let i = 0; i < dim; i++) m[i]! -= mean[i]!;
      rows.set(unit(m), row * dim);
    }
    return new MeaningIndex(vectors, mean, rows, meanings.length, rowOf);
  }

  /** The `k` passages (of those indexed with an id, and that `keep` keeps) whose meaning comes closest to `query`'s, best first, by centred cosine. */
  search(query: string, k: number, keep?: (id: string) => boolean): { readonly id: string; readonly score: number }[] {
    const q = this.centred(query);
    if (q === undefined) return [];
    const hits: { id: string; score: number }[] = [];
    for (const [id, row] of this.rowOf) if (keep === undefined || keep(id)) hits.push({ id, score: this.dot(q, row) });
    return hits.sort((a, b) => b.score - a.score).slice(0, k);
  }

  /** `text`'s meaning centred on the corpus's, unit length; undefined when it has no known word. */
  centred(text: string): Float32Array | undefined {
    const q = unit(this.vectors.embed(text));
    if (q.every((x) => x === 0)) return undefined;
    for (let i = 0; i < q.length; i++) q[i]! -= this.mean[i]!;
    return unit(q);
  }

  /** The best cosine between `query`'s centred meaning and a passage's, in [-1, 1]; 0 when the query has no known word or the corpus no passage. */
  best(query: string): number {
    const q = this.centred(query);
    if (q === undefined || this.size === 0) return 0;
    let best = -1;
    for (let row = 0; row < this.size; row++) best = Math.max(best, this.dot(q, row));
    return best;
  }

  /** The cosine of the unit vector `q` to the passage in `row`. */
  private dot(q: Float32Array, row: number): number {
    let sum = 0;
    const at = row * q.length;
    for (let i = 0; i < q.length; i++) sum += q[i]! * this.rows[at + i]!;
    return sum;
  }
}

/** `v` scaled to unit length in place (all zeros stay zeros). */
function unit(v: Float32Array): Float32Array {
  let norm = 0;
  for (const x of v) norm += x * x;
  if (norm > 0) {
    const scale = 1 / Math.sqrt(norm);
    for (let i = 0; i < v.length; i++) v[i]! *= scale;
  }
  return v;
}
