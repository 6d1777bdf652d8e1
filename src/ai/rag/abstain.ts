/**
 * When retrieval found nothing worth quoting. Two signals, each relative to this corpus and this
 * query rather than one fixed score: the share of the query's information (IDF mass) the best
 * passage holds, and how far the best cosine stands above what every passage scores for the query.
 */

/** What retrieval found for a query, as evidence that the documents answer it. */
export interface Evidence {
  /** The largest share of the query's IDF mass that one retrieved passage holds, in [0, 1]; undefined without a lexical index. */
  readonly lexical?: number;
  /**
   * The best cosine in standard deviations above the mean over every passage, in units of √(2 ln n)
   * (where the best of n chance scores would stand): above 1, it stands out. Undefined without a query vector.
   */
  readonly dense?: number;
}

/** How much evidence an answer needs. */
export interface AbstainOptions {
  /** A passage holding this share of the query's IDF mass is enough alone. Default 0.5. */
  readonly coverage?: number;
  /** A passage holding at least this share is enough when the dense signal agrees. Default 0.35. */
  readonly partialCoverage?: number;
  /** The dense signal agrees when `Evidence.dense` is at least this. Default 1. */
  readonly dense?: number;
}

/** The defaults of `AbstainOptions`. */
export const DEFAULT_ABSTAIN: Required<AbstainOptions> = { coverage: 0.5, partialCoverage: 0.35, dense: 1 };

/**
 * Whether the evidence supports an answer: most of what the question asks about is in one passage,
 * or a good part of it is and the embedding agrees that passage stands out from the corpus. Without
 * a lexical index, the dense signal alone decides.
 */
export function supportsAnswer(evidence: Evidence, options: AbstainOptions = {}): boolean {
  const thresholds = { ...DEFAULT_ABSTAIN, ...options };
  const { coverage, partialCoverage } = thresholds;
  const dense = evidence.dense !== undefined && evidence.dense >= thresholds.dense;
  // Without a lexical index the embedding is all there is to go by.
  if (evidence.lexical === undefined) return dense;
  return evidence.lexical >= coverage || (evidence.lexical >= partialCoverage && dense);
}
