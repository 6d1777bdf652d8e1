/**
 * Pseudo-relevance feedback (RM3, Abdul-Jaleel et al., TREC 2004): the words that the passages a
 * query found first share, added to the query with a lower weight, so a passage that says the
 * same thing in the corpus's own words (`redact` for "hide a field") can still be found.
 */
import { type ExpansionTerm, lexicalTokens } from './lexical-index.js';

export type { ExpansionTerm } from './lexical-index.js';

/** How a query is expanded from the passages it found first. */
export interface FeedbackOptions {
  /** Passages found first that feedback terms are drawn from. */
  readonly passages: number;
  /** Feedback terms added at most. */
  readonly terms: number;
  /** The weight of the strongest feedback term; the others weigh in proportion. */
  readonly weight: number;
}

/** What expansion needs of the index: how rare a term is. */
export interface FeedbackSource {
  /** How rare `term` is in the corpus (BM25's IDF, e.g. `LexicalIndex.idf`). */
  idf(term: string): number;
}

/**
 * The feedback terms for `query` (its indexed terms) from the passages it found first (their text
 * and retrieval score): each term weighed by its share of each passage's words, times the passage's
 * share of the scores (the relevance model), times its IDF so a word every passage holds adds nothing.
 */
export function feedbackTerms(
  query: readonly string[],
  found: readonly { readonly text: string; readonly score: number }[],
  index: FeedbackSource,
  options: Pick<FeedbackOptions, 'terms' | 'weight'>,
): ExpansionTerm[] {
  const total = found.reduce((sum, passage) => sum + Math.max(0, passage.score), 0);
  if (total === 0 || options.terms === 0) return [];
  const asked = new Set(query);
  const relevance = new Map<string, number>();
  for (const passage of found) {
    const tokens = lexicalTokens(passage.text);
    if (tokens.length === 0) continue;
    const share = Math.max(0, passage.score) / total;
    for (const token of tokens) if (!asked.has(token)) relevance.set(token, (relevance.get(token) ?? 0) + share / tokens.length);
  }
  const ranked = [...relevance.entries()]
    .map(([term, p]) => ({ term, value: p * index.idf(term) }))
    .sort((a, b) => b.value - a.value || (a.term < b.term ? -1 : 1))
    .slice(0, options.terms);
  const top = ranked[0]?.value ?? 0;
  return top === 0 ? [] : ranked.map(({ term, value }) => ({ term, weight: (options.weight * value) / top }));
}
