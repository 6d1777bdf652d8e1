/**
 * BM25 at the level of sentences: how well each sentence, code line or table row of the retrieved
 * passages answers the query's words, each word weighted by its IDF over the whole corpus (not over
 * the few sentences at hand, where every word is rare). The passage's headings are context: a query
 * word they hold counts for the sentences below them, at a part of its weight.
 */

import type { Expectation } from './answer-kind.js';

/** The query's words and how much each says (e.g. a `LexicalIndex`'s IDF), to rank sentences by the words they share with it. */
export interface QueryTerms {
  /** The query's distinct indexed terms. */
  readonly terms: readonly string[];
  /** How much a term says: its IDF over the corpus. */
  readonly weight: (term: string) => number;
  /** The indexed terms of a text, as the query's were made, one per occurrence. */
  readonly termsOf: (text: string) => readonly string[];
  /** What the question asks for beyond its words (`expectedAnswer`): a sentence holding it scores higher. Default: nothing in particular. */
  readonly expects?: Expectation;
  /** The question asks how to do something (`asksHowTo`): a sentence naming an option, a function or a command likelier answers it. Default false. */
  readonly howTo?: boolean;
}

/** A sentence to score, and the headings of the passage it comes from. */
export interface ScoredText {
  readonly text: string;
  readonly headings?: string;
}

/** BM25's term-frequency saturation. */
const K1 = 1.2;
/** BM25's length normalisation: a long line holds query words by chance more often. */
const B = 0.75;
/** A query word held only by the headings above a sentence counts this part of its weight. */
const HEADING_SHARE = 0.5;

/** Links: words of a URL are no evidence that a sentence answers. */
const URL = /\bhttps?:\/\/\S+/g;

/** What one sentence holds of the query: its score, and the query terms it (or its headings) holds. */
export interface SentenceMatch {
  /**
   * BM25 of the sentence over the query's terms, divided by the query's whole IDF mass: about the
   * share of the query's information the sentence holds (1 for every term once, at average length).
   */
  readonly score: number;
  /** The query terms the sentence holds, in its text or its headings. */
  readonly held: ReadonlySet<string>;
  /** How many of `held` its text holds itself (the rest only its headings). */
  readonly own: number;
  /** How many indexed terms its text has: its length as BM25 reads it. */
  readonly length: number;
}

/** Scores `sentences` against the query, every one in the light of the others' lengths. */
export function matchSentences(sentences: readonly ScoredText[], words: QueryTerms): SentenceMatch[] {
  const query = new Set(words.terms);
  const counted = sentences.map((s) => {
    // Most sentences hold no link: then the text itself, whose terms a caller may have remembered, is what is read.
    const terms = words.termsOf(s.text.includes('http') ? s.text.replace(URL, ' ') : s.text);
    const frequency = new Map<string, number>();
    for (const term of terms) if (query.has(term)) frequency.set(term, (frequency.get(term) ?? 0) + 1);
    const headings = new Set(words.termsOf(s.headings ?? '').filter((term) => query.has(term)));
    return { length: terms.length, frequency, headings };
  });
  const average = counted.reduce((sum, c) => sum + c.length, 0) / Math.max(1, counted.length) || 1;
  let mass = 0;
  for (const term of query) mass += words.weight(term);
  return counted.map(({ length, frequency, headings }) => {
    const norm = K1 * (1 - B + (B * length) / average);
    let score = 0;
    const held = new Set<string>();
    for (const term of query) {
      const tf = frequency.get(term) ?? 0;
      if (tf > 0) {
        score += (words.weight(term) * tf * (K1 + 1)) / (tf + norm);
        held.add(term);
      } else if (headings.has(term)) {
        score += HEADING_SHARE * words.weight(term);
        held.add(term);
      }
    }
    return { score: mass === 0 ? 0 : score / mass, held, own: frequency.size, length };
  });
}

/** The share of the query's IDF mass in `terms` that `held` lacks: what a further sentence could add. */
export function missingMass(words: QueryTerms, held: ReadonlySet<string>, terms: ReadonlySet<string>): number {
  let mass = 0;
  let added = 0;
  for (const term of words.terms) {
    const weight = words.weight(term);
    mass += weight;
    if (terms.has(term) && !held.has(term)) added += weight;
  }
  return mass === 0 ? 0 : added / mass;
}
