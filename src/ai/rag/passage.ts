/** A piece of a document, the unit that is embedded, retrieved and cited. */
export interface Passage {
  /** Unique in its index, stable across rebuilds (`file#heading-n`). */
  readonly id: string;
  readonly text: string;
  /** Where it comes from, as cited: `file › heading`. */
  readonly source: string;
}

/** What a `VectorIndex` holds beside each passage vector, so retrieval can return the passage. */
export interface PassageMetadata {
  readonly text: string;
  readonly source: string;
}

/** A passage found for a query, with its cosine similarity. */
export interface RetrievedPassage extends Passage {
  readonly score: number;
}
