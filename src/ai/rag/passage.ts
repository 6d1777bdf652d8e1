/** A piece of a document, the unit that is embedded, retrieved and cited. */
export interface Passage {
  /** Unique in its index, stable across rebuilds (`file#heading-n`). */
  readonly id: string;
  readonly text: string;
  /** Where it comes from, as cited: `file › heading`. */
  readonly source: string;
  /** The headings above it, outermost first (`Guide › Install`): searched with the text, never quoted. */
  readonly headings?: string;
}

/** What a `VectorIndex` holds beside each passage vector, so retrieval can return the passage. */
export interface PassageMetadata {
  readonly text: string;
  readonly source: string;
  /** The passage's heading path, when it has one. */
  readonly headings?: string;
}

/** A passage found for a query, with its score (cosine similarity; for lexical or fused retrieval, that ranking's score). */
export interface RetrievedPassage extends Passage {
  readonly score: number;
}
