/**
 * When retrieval found nothing worth quoting. A passage holding most of the query's IDF mass
 * answers it; no query word held anywhere abstains; between the two, a logistic decision fitted
 * across corpora (`eval/fit-abstain.ts`, recorded in docs/internals/eval-figures.md) weighs the best
 * BM25 score against the query's IDF mass, and the query's length: both relative to this corpus and
 * this query, not one fixed score.
 */
import { lazySchema } from '../../core/zod.js';

/** What retrieval found for a query, as evidence that the documents answer it. */
export interface Evidence {
  /** The largest share of the query's IDF mass that one retrieved passage holds, in [0, 1]; undefined without a lexical index. */
  readonly lexical?: number;
  /** The best `LexicalIndex.specificity` among the retrieved passages: how sharply the query words one holds single it out. */
  readonly specificity?: number;
  /**
   * The best cosine in standard deviations above the mean over every passage, in units of √(2 ln n)
   * (where the best of n chance scores would stand): above 1, it stands out. Undefined without a query vector.
   */
  readonly dense?: number;
  /** The best BM25 score of any passage divided by the query's IDF mass (0 when no passage holds a query word); undefined without a lexical index. */
  readonly bm25?: number;
  /** The query's distinct indexed terms (stop words aside); undefined without a lexical index. */
  readonly terms?: number;
}

/** How much evidence an answer needs. */
export interface AbstainOptions {
  /** Log-odds added to the fitted decision: above 0 answers more questions, below 0 abstains on more. Default 0. */
  readonly leniency?: number;
  /** Without a lexical index, the dense signal (`Evidence.dense`) an answer needs. Default 1. */
  readonly dense?: number;
}

/** The defaults of `AbstainOptions`. */
export const DEFAULT_ABSTAIN: Required<AbstainOptions> = { leniency: 0, dense: 1 };

/** The schema of `AbstainOptions`: invalid options fail with the path of the bad field. */
export const abstainOptionsSchema = lazySchema((z) =>
  z.strictObject({
    leniency: z.number({ error: 'leniency must be a number' }).finite({ error: 'leniency must be finite' }).optional(),
    dense: z.number({ error: 'dense must be a number' }).optional(),
  }),
);

/**
 * The fitted decision, `INTERCEPT + Σ weight·feature` in log-odds of the question being covered:
 * logistic regression over every question set of eval/sets/, its threshold set so that answering an
 * uncovered question costs as much as abstaining on 8 covered ones (`npm run fit:abstain`; the fit
 * and its cross-validation are in docs/internals/eval-figures.md).
 */
const INTERCEPT = -12.129;
/** Weight of ln(`Evidence.bm25`). */
const LOG_BM25_WEIGHT = 3.266;
/** Weight of `Evidence.terms`. */
const TERMS_WEIGHT = 1.399;

/** A passage holding this share of the query's IDF mass answers it whatever the fitted odds: most of what is asked is there. */
const MAJORITY = 0.5;

/** A score share below this counts as this: no query word held is the strongest "no", not minus infinity. */
const BM25_FLOOR = 1e-3;
/** Terms beyond this count as this: the fitting sets held no uncovered question this long, so the fit says nothing past it. */
const TERMS_CAP = 8;

/** The features the decision weighs, in the order of its weights: ln of the BM25 share, the query's term count (capped). */
export function abstentionFeatures(evidence: Evidence): readonly number[] | undefined {
  if (evidence.bm25 === undefined || evidence.terms === undefined) return undefined;
  return [Math.log(Math.max(BM25_FLOOR, evidence.bm25)), Math.min(TERMS_CAP, evidence.terms)];
}

/**
 * The cases no weight decides: a passage holding most of the query's IDF mass answers it, however
 * short the question or small the corpus (`true`); no query word held by any passage abstains
 * (`false`). Undefined when the fitted odds decide, or without lexical evidence.
 */
export function settledByCoverage(evidence: Evidence): boolean | undefined {
  if (evidence.bm25 === undefined || evidence.terms === undefined) return undefined;
  if (evidence.terms === 0 || evidence.bm25 === 0) return false;
  if (evidence.lexical !== undefined && evidence.lexical >= MAJORITY) return true;
  return undefined;
}

/** The fitted log-odds that the documents answer the query; undefined without lexical evidence. */
export function answerLogOdds(evidence: Evidence): number | undefined {
  const features = abstentionFeatures(evidence);
  if (features === undefined) return undefined;
  return INTERCEPT + LOG_BM25_WEIGHT * features[0]! + TERMS_WEIGHT * features[1]!;
}

/**
 * Whether the evidence supports an answer: `settledByCoverage` when it settles it, else the fitted
 * log-odds (`answerLogOdds`) plus `leniency` above 0. Without a lexical index, the dense signal
 * alone decides (`Evidence.dense ≥ options.dense`).
 */
export function supportsAnswer(evidence: Evidence, options: AbstainOptions = {}): boolean {
  const { leniency, dense } = { ...DEFAULT_ABSTAIN, ...options };
  const odds = answerLogOdds(evidence);
  // Without a lexical index the embedding is all there is to go by.
  if (odds === undefined) return evidence.dense !== undefined && evidence.dense >= dense;
  return settledByCoverage(evidence) ?? odds + leniency > 0;
}
