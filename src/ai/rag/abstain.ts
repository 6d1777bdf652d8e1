/**
 * When retrieval found nothing worth quoting. Two signals, each relative to this corpus and this
 * query rather than one fixed score: the share of the query's information (IDF mass) the best
 * passage holds, and how far the best cosine stands above what every passage scores for the query.
 */

/** What retrieval found for a query, as evidence that the documents answer it. */
export interface Evidence {
  /** The largest share of the query's IDF mass that one retrieved passage holds, in [0, 1]; undefined without a lexical index. */
  readonly lexical?: number;
  /** The best cosine in standard deviations above the mean over every passage; undefined without a query vector. */
  readonly dense?: number;
}

/** How much evidence an answer needs. */
export interface AbstainOptions {
  /** A passage holding this share of the query's IDF mass is enough alone. Default 0.4. */
  readonly coverage?: number;
  /** A passage holding at least this share is enough when the dense signal agrees. Default 0.25. */
  readonly partialCoverage?: number;
  /** The dense signal agrees when the best cosine stands this many standard deviations above the mean. Default 2.5. */
  readonly denseDeviations?: number;
}

/** The defaults of `AbstainOptions`. */
export const DEFAULT_ABSTAIN: Required<AbstainOptions> = { coverage: 0.4, partialCoverage: 0.25, denseDeviations: 2.5 };

/**
 * Whether the evidence supports an answer: most of what the question asks about is in one passage,
 * or a good part of it is and the embedding agrees that passage stands out from the corpus. Without
 * a lexical index, the dense signal alone decides.
 */
export function supportsAnswer(evidence: Evidence, options: AbstainOptions = {}): boolean {
  const { coverage, partialCoverage, denseDeviations } = { ...DEFAULT_ABSTAIN, ...options };
  const dense = evidence.dense !== undefined && evidence.dense >= denseDeviations;
  // Without a lexical index the embedding is all there is to go by.
  if (evidence.lexical === undefined) return dense;
  return evidence.lexical >= coverage || (evidence.lexical >= partialCoverage && dense);
}
