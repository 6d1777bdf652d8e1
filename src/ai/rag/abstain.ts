/**
 * When retrieval found nothing worth quoting. Four signals, each relative to this corpus and this
 * query rather than one fixed score: the share of the query's information (IDF mass, everyday words
 * weighing little) the best passage holds and the share its best page holds, how sharply the words
 * a passage holds single it out among the corpus's passages, and how far the best cosine stands
 * above what every passage scores for the query.
 */

/** What retrieval found for a query, as evidence that the documents answer it. */
export interface Evidence {
  /** The largest share of the query's IDF mass that one retrieved passage holds, in [0, 1]; undefined without a lexical index. */
  readonly lexical?: number;
  /** The largest share of the query's IDF mass that one document (all its passages) holds, in [0, 1]; undefined without a lexical index. */
  readonly document?: number;
  /** The best `LexicalIndex.specificity` among the retrieved passages: how sharply the query words one holds single it out. */
  readonly specificity?: number;
  /**
   * The best cosine in standard deviations above the mean over every passage, in units of √(2 ln n)
   * (where the best of n chance scores would stand): above 1, it stands out. Undefined without a query vector.
   */
  readonly dense?: number;
  /**
   * The best cosine between the question's word-vector meaning and a passage's, both centred on the
   * corpus's mean (`MeaningIndex.best`), in [-1, 1]; undefined without word vectors.
   */
  readonly meaning?: number;
  /** A name the question uses (`namesIn`) that no passage mentions: the corpus is not about what it asks. */
  readonly unknownName?: string;
}

/** How much evidence an answer needs. */
export interface AbstainOptions {
  /** Enough when the passage's share of the query's IDF mass and its page's share average at least this (a passage holding it is enough alone). Default 0.5. */
  readonly coverage?: number;
  /** The share the passage itself must hold at least, however much of the rest its page holds. Default 0.25. */
  readonly passageCoverage?: number;
  /** A passage holding at least this share is enough when the dense signal agrees. Default 0.35. */
  readonly partialCoverage?: number;
  /** The dense signal agrees when `Evidence.dense` is at least this. Default 1. */
  readonly dense?: number;
  /** Query words singling out a passage this sharply (`Evidence.specificity`) are enough, with `specificCoverage`. Default 1.5: chance puts them in 1/√n of n passages. */
  readonly specificity?: number;
  /** The share of the query's IDF mass a passage singled out by `specificity` must hold at least. Default 0.3. */
  readonly specificCoverage?: number;
  /** A passage holding at least `meaningCoverage` of the query is enough when some passage means what the question does this closely (`Evidence.meaning`). Default 0.6. */
  readonly meaning?: number;
  /** The share of the query's IDF mass a passage must hold for `meaning` to count. Default 0.2. */
  readonly meaningCoverage?: number;
  /** Abstain when the question names something (`Evidence.unknownName`: `PostgreSQL`, `in Kubernetes`) no passage mentions. Default true. */
  readonly names?: boolean;
}

/** The defaults of `AbstainOptions`. */
export const DEFAULT_ABSTAIN: Required<AbstainOptions> = {
  coverage: 0.5,
  passageCoverage: 0.25,
  partialCoverage: 0.35,
  dense: 1,
  specificity: 1.5,
  specificCoverage: 0.3,
  meaning: 0.6,
  meaningCoverage: 0.2,
  names: true,
};

/**
 * Whether the evidence supports an answer: the question names nothing the documents never mention,
 * and most of what it asks about is in one passage,
 * or in one page with a good part of it in one passage, or a good part of it is in one passage and
 * either the embedding agrees that passage stands out from the corpus or the words it holds are rare
 * enough together that chance would put them in under 1/√n of n passages (specificity 1.5). Without
 * a lexical index, the dense signal alone decides.
 */
export function supportsAnswer(evidence: Evidence, options: AbstainOptions = {}): boolean {
  const thresholds = { ...DEFAULT_ABSTAIN, ...options };
  const { coverage, partialCoverage } = thresholds;
  const dense = evidence.dense !== undefined && evidence.dense >= thresholds.dense;
  // A question about something the documents never name is not answered from them, whatever words it shares.
  if (thresholds.names && evidence.unknownName !== undefined) return false;
  // Without a lexical index the embedding is all there is to go by.
  if (evidence.lexical === undefined) return dense;
  // Rare words held together in one passage are unlikely by chance, even when the question says more than they do.
  const specific = evidence.specificity !== undefined && evidence.specificity >= thresholds.specificity && evidence.lexical >= thresholds.specificCoverage;
  // A page holding the rest of the question vouches for a passage holding part of it.
  const held = (evidence.lexical + (evidence.document ?? evidence.lexical)) / 2;
  return (
    (held >= coverage && evidence.lexical >= thresholds.passageCoverage) ||
    evidence.lexical >= coverage ||
    (evidence.lexical >= partialCoverage && dense) ||
    specific ||
    // Word vectors find the question's meaning in the corpus, said in other words than its own.
    (evidence.meaning !== undefined && evidence.meaning >= thresholds.meaning && evidence.lexical >= thresholds.meaningCoverage)
  );
}
