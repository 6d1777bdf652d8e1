/**
 * Hybrid retrieval: the dense index (cosine) and the lexical one (BM25) each rank the passages, and
 * word meanings too when there are word vectors; their scores, each divided by its ranking's best,
 * are weighed and summed (`scoreFusion`), and the evidence for an answer is weighed. Either index
 * can be used alone.
 */
import type { Evidence } from './abstain.js';
import { scoreFusion } from './fusion.js';
import type { LexicalIndex } from './lexical-index.js';
import type { MeaningIndex } from './meaning-index.js';
import { fileOf, lexicalTerms } from './lexical-index.js';
import { isCodeMember, namesIn } from './names.js';
import { feedbackTerms, type FeedbackOptions } from './query-expansion.js';
import type { PassageMetadata, RetrievedPassage } from './passage.js';
import type { VectorIndex } from './vector-index.js';

/** Which rankings retrieval uses: both fused (`hybrid`), the embedding's (`dense`) or BM25's (`lexical`). */
export type RetrievalMode = 'hybrid' | 'dense' | 'lexical';
/** What the lexical index ranks: `passage`s, heading `section`s (each standing for its best passage), or `both`, fused. */
export type LexicalGranularity = 'passage' | 'section' | 'both';

/** Every `LexicalGranularity`. */
export const LEXICAL_GRANULARITIES = ['passage', 'section', 'both'] as const satisfies readonly LexicalGranularity[];

/** Every `RetrievalMode`. */
export const RETRIEVAL_MODES = ['hybrid', 'dense', 'lexical'] as const satisfies readonly RetrievalMode[];

/** What one query retrieved, and the evidence it gives. */
export interface Retrieval {
  /** Best first; scores are cosine (`dense`), BM25 (`lexical`) or the fused score (`hybrid`). */
  readonly passages: readonly RetrievedPassage[];
  readonly evidence: Evidence;
}

/** The indexes and how to search them. */
export interface RetrievalPlan<M extends PassageMetadata> {
  /** The dense index. */
  readonly index: VectorIndex<M>;
  /** BM25 over the same passages; without it there is no lexical ranking nor lexical evidence. */
  readonly lexical?: LexicalIndex<M>;
  /** The same passages' word-vector meanings: a further ranking in hybrid retrieval, and evidence (`Evidence.meaning`). */
  readonly meaning?: MeaningIndex;
  /** How much the meaning ranking's scores count in hybrid fusion, BM25's counting 1. Default 0.5. */
  readonly meaningWeight?: number;
  readonly mode: RetrievalMode;
  /** Passages returned at most. */
  readonly k: number;
  /** Dense hits below this cosine are left out. */
  readonly minScore?: number;
  /** Keeps only passages whose metadata passes, in both rankings. */
  readonly filter?: (metadata: M) => boolean;
  /** How much the dense ranking's scores count in hybrid fusion, BM25's counting 1. Default 0.5. */
  readonly denseWeight?: number;
  /** What BM25 ranks: single passages, heading sections (mapped back to a passage), or `both` fused. Default `passage`. */
  readonly granularity?: LexicalGranularity;
  /** Pseudo-relevance feedback: the passage ranking searched again with terms its first passages share. Default: none. */
  readonly feedback?: FeedbackOptions;
}

/** The generated embedding model hashes words: its ranking is a weaker witness than BM25's, and counts half. */
const DENSE_WEIGHT = 0.5;

/** Word vectors read meaning, if coarsely: their ranking counts as much as the generated embedder's. */
const MEANING_WEIGHT = 0.5;

/** What a passage of a document the question names (`LexicalIndex.namedFiles`) adds to its fused score, as a share of it. */
const NAMED_FILE_WEIGHT = 0.15;

/** What a passage headed by an API the question names (`readable.pipe` for `readable.pipe(destination[, options])`) adds to its fused score, as a share of it. */
const NAMED_API_WEIGHT = 0.15;

/** What a heading may say before the API it names: `Class: fs.Dir`, `Static method: Buffer.from(…)`, `Event: 'close'`. */
const API_LABEL = /^(?:(?:static |instance )?(?:method|property|function|class|event)\s*:\s*)/i;

/** Whether `headings`' innermost heading names one of `members` (lower case) as its API: the name alone or followed by its parameters. */
export function headsApi(headings: string | undefined, members: readonly string[]): boolean {
  const heading = headings?.split(' › ').at(-1)?.replace(/`/g, '').trim().toLowerCase().replace(API_LABEL, '');
  return heading !== undefined && members.some((m) => heading === m || (heading.startsWith(m) && /^[([ ]/.test(heading.slice(m.length))));
}

/** Lexical evidence is the best coverage among this many top passages, whatever `k`. */
const EVIDENCE_DEPTH = 3;

/** Each ranking is read this deep before fusion, so a passage second in one and tenth in the other still counts. */
const depth = (k: number): number => Math.max(20, 4 * k);

/**
 * The `k` passages for a query (its text and, for dense and hybrid retrieval, its vector), and the
 * evidence: the best lexical coverage among the first three, and the best cosine in standard deviations above
 * the mean over the corpus, divided by √(2 ln n), about where the best of n chance scores would stand.
 * A vector of all zeros (nothing the embedder knows) gives no dense ranking.
 */
export function retrievePassages<M extends PassageMetadata>(plan: RetrievalPlan<M>, text: string, vector: ArrayLike<number> | undefined): Retrieval {
  const { index, lexical, mode, k, filter } = plan;
  // A vector of the wrong size still reaches the index, which names the mistake.
  const usable = vector !== undefined && !(vector.length > 0 && isZero(vector));
  const dense =
    mode !== 'lexical' && usable
      ? index.search(vector, {
          k: mode === 'dense' ? k : depth(k),
          ...(plan.minScore !== undefined && { minScore: plan.minScore }),
          ...(filter !== undefined && { filter }),
        })
      : [];
  const granularity = plan.granularity ?? 'passage';
  const lexicalRanks = mode !== 'dense' && lexical !== undefined;
  const lexicalDepth = mode === 'lexical' && granularity === 'passage' ? k : depth(k);
  // A compound the question writes as two words ("thread pool") is searched as the corpus writes it too (`threadpool`), as a word of its own.
  const compounds = lexical === undefined ? [] : lexical.compounds(text).map((term) => ({ term, weight: 1 }));
  let words = lexicalRanks && granularity !== 'section' ? lexical.search(text, lexicalDepth, filter, compounds) : [];
  if (plan.feedback !== undefined && words.length > 0) {
    const found = words.slice(0, plan.feedback.passages).map((h) => ({ text: h.metadata.text, score: h.score }));
    words = lexical!.search(text, lexicalDepth, filter, feedbackTerms(lexicalTerms(text), found, lexical!, plan.feedback));
  }
  const sections = lexicalRanks && granularity !== 'passage' ? lexical.searchSections(text, depth(k), filter) : [];
  // Word meanings rank passages beside the embedding, in hybrid retrieval; a cosine below 0 is no evidence.
  const meanings =
    mode === 'hybrid' && plan.meaning !== undefined
      ? plan.meaning
          .search(text, depth(k), (id) => {
            const m = index.get(id);
            return m !== undefined && (filter === undefined || filter(m));
          })
          .filter((h) => h.score > 0)
          .map((h) => ({ id: h.id, score: h.score, metadata: index.get(h.id)! }))
      : [];
  const metadata = new Map<string, M>([...dense, ...words, ...sections, ...meanings].map((h) => [h.id, h.metadata] as const));
  const ranked =
    mode === 'dense'
      ? dense.map((h) => ({ id: h.id, score: h.score }))
      : mode === 'lexical' && granularity !== 'both'
        ? (granularity === 'passage' ? words : sections).slice(0, k).map((h) => ({ id: h.id, score: h.score }))
        : scoreFusion(
            [dense, words, sections, meanings],
            [plan.denseWeight ?? DENSE_WEIGHT, 1, 1, plan.meaningWeight ?? MEANING_WEIGHT],
            // A search that found fewer than it was asked for holds every passage that scores at all.
            [dense.length < depth(k), words.length < lexicalDepth, sections.length < depth(k), meanings.length < depth(k)],
          );
  const named = mode === 'hybrid' && lexical !== undefined ? lexical.namedFiles(text) : undefined;
  // Dense and meaning rankings do not read file names: a question naming a document's subject favours its passages.
  const byFile = named === undefined || named.size === 0 ? ranked : favour(ranked, (id) => named.has(fileOf(metadata.get(id)!.source)), NAMED_FILE_WEIGHT);
  // A question naming an API in code (`readable.pipe`) favours the section headed by it over others holding the same words.
  const members =
    mode === 'hybrid'
      ? namesIn(text)
          .filter(isCodeMember)
          .map((m) => m.toLowerCase())
      : [];
  const chosen = (members.length === 0 ? byFile : favour(byFile, (id) => headsApi(metadata.get(id)!.headings, members), NAMED_API_WEIGHT)).slice(0, k);
  const passages = chosen.map(({ id, score }) => {
    const m = metadata.get(id)!;
    return { id, score, text: m.text, source: m.source, ...(m.headings !== undefined && { headings: m.headings }) };
  });
  // An unfiltered dense ranking already holds the corpus's best score.
  const best = plan.filter === undefined && plan.minScore === undefined ? dense[0]?.score : undefined;
  return { passages, evidence: evidenceFor(plan, text, usable ? vector : undefined, passages, best) };
}

/** The evidence the retrieved passages give for `text`. */
function evidenceFor<M extends PassageMetadata>(
  plan: RetrievalPlan<M>,
  text: string,
  vector: ArrayLike<number> | undefined,
  passages: readonly RetrievedPassage[],
  best: number | undefined,
): Evidence {
  const terms = lexicalTerms(text);
  // The best few only: the more passages looked at, the likelier one shares words with any question.
  const lexical = plan.lexical === undefined ? undefined : Math.max(0, ...passages.slice(0, EVIDENCE_DEPTH).map((p) => plan.lexical!.coverage(terms, p.id)));
  const specificity =
    plan.lexical === undefined ? undefined : Math.max(0, ...passages.slice(0, EVIDENCE_DEPTH).map((p) => plan.lexical!.specificity(terms, p.id)));
  const unknown = plan.lexical === undefined ? undefined : namesIn(text).find((name) => !plan.lexical!.mentions(name));
  const known = {
    ...(lexical !== undefined && {
      lexical,
      specificity,
      document: plan.lexical!.documentCoverage(terms),
      ...(unknown !== undefined && { unknownName: unknown }),
    }),
    ...(plan.meaning !== undefined && { meaning: plan.meaning.best(text) }),
  };
  if (vector === undefined || plan.index.size < 2) return known;
  const top = best ?? plan.index.search(vector, { k: 1 })[0]?.score;
  const { mean, std } = plan.index.scoreMoments(vector);
  // The best of n scores drawn by chance stands about √(2 ln n) deviations above their mean: the unit the best is measured in.
  const chance = Math.sqrt(2 * Math.log(plan.index.size));
  return { ...known, dense: top === undefined || std === 0 ? 0 : (top - mean) / std / chance };
}

/** `ranked` again, best first, with the score of each passage `isNamed` says raised by the share `weight`. */
function favour<T extends { readonly id: string; readonly score: number }>(ranked: readonly T[], isNamed: (id: string) => boolean, weight: number): T[] {
  return ranked.map((r) => (isNamed(r.id) ? { ...r, score: r.score * (1 + weight) } : r)).sort((a, b) => b.score - a.score);
}

function isZero(vector: ArrayLike<number>): boolean {
  for (let i = 0; i < vector.length; i++) if (vector[i] !== 0) return false;
  return true;
}
