/**
 * The terms of lexical search: a text's words (code identifiers split), folded, stemmed, and
 * function words left out. Both indexes, query expansion and the background model of English
 * count words as these terms.
 */
import { stemmer } from 'stemmer';
import { TextMemo } from './text-memo.js';

/** Function words that carry no subject: never indexed, never asked for. */
const STOP_WORDS = new Set(
  (
    'a an and are as at be been but by can could did do does doing for from had has have how i if in into is it its ' +
    'me my no not of on or our should so than that the their them then there these they this those to too was we ' +
    'were what when where which while who whom why will with would you your yours about after before all any each ' +
    'more most other some such several every few various only own same just also very s t don get got use used using one many much long often ' +
    'happen happens mean means work works need want tell explain example way possible available'
  ).split(' '),
);

/**
 * A term as indexed: lower case, folded accents, stemmed by Porter's algorithm (`policies` and
 * `policy`, `authentication` and `authenticated` meet), then an agent's `-er` dropped (`keeper` and
 * `keeps`, `server` and `serve`). Stop words and single letters are no term; a single digit is.
 */
export function lexicalTerm(word: string): string | null {
  return stems.get(word);
}

/** Words of every corpus and question meet again and again: each is stemmed once (bounded, as questions bring new words). */
const stems = new TextMemo(termOf, 1 << 15);

/** `lexicalTerm` without remembering it: for a word list read once, which would only crowd out a corpus's words. */
export function termOf(word: string): string | null {
  const term = word.toLowerCase().normalize('NFKD').replace(/\p{M}/gu, '');
  // A lone digit is a version or a count (`fast-check 4`); a lone letter says nothing.
  if ((term.length < 2 && !/^\p{N}$/u.test(term)) || STOP_WORDS.has(term)) return null;
  if (!/^\p{L}+$/u.test(term)) return term; // numbers, identifiers with digits: as they are
  let stem = stemmer(term);
  // Porter leaves an adverb's -ly after a consonant (`quietly`, `explicitly`); Porter2 drops it after c d e g h k m n r t.
  if (stem.length >= 6 && /[cdeghkmnrt]li$/.test(stem)) stem = stem.slice(0, -2);
  return stem.length > 5 && stem.endsWith('er') ? stem.slice(0, -2) : stem;
}

/** HTML comments and tags: their attributes (`<div align="center">`) say nothing about the subject. */
const MARKUP = /<!--[\s\S]*?(?:-->|$)|<\/?[A-Za-z][^>]*>/g;

/** A language named by a letter and its signs (`C++`, `C#`, `F#`, `g++`): without them it would be a lone letter, no term at all. */
const LANGUAGE = /(?<![\p{L}\p{N}_])(?:([CcGg])\+\+|([CcFfJj])#)(?![\p{L}\p{N}_+#])/gu;
/** Two lone letters around a slash are one abbreviation (`I/O`, `A/B`, `R/W`), not two letters that say nothing. */
const SLASHED = /(?<![\p{L}\p{N}_/])(\p{L})\/(\p{L})(?![\p{L}\p{N}_/])/gu;
/** A protocol and its version (`HTTP/2`, `HTTP/1.1`): also one word, as code names it (`http2`), beside its parts. */
const VERSIONED = /(?<![\p{L}\p{N}_/])(\p{L}{2,})\/(\d+)(?=[.\s,;:)!?]|$)/gu;
const languageWord = (_: string, plus: string | undefined, sharp: string | undefined): string =>
  plus !== undefined ? `${plus.toLowerCase()}plusplus` : `${sharp!.toLowerCase()}sharp`;

/** A lower-case letter or digit followed by a capital: where a camel-case identifier's words meet. */
const CASE_CHANGE = /([\p{Ll}\p{N}])(\p{Lu})/gu;

/**
 * Words of a text: runs of letters and digits (so code identifiers split at `_`, `-` and `.`),
 * outside HTML tags, with `C++` read as `cplusplus`, `C#` as `csharp`, `I/O` as `IO` and `HTTP/2` also
 * as `HTTP2`. A run with case changes counts whole and as its parts: `OpenAI` is a name of its own,
 * and `createOpenAICompatible` also says `create` and `compatible`.
 */
export function words(text: string): string[] {
  const found: string[] = [];
  for (const run of text
    .replace(MARKUP, ' ')
    .replace(LANGUAGE, languageWord)
    .replace(SLASHED, '$1$2')
    .replace(VERSIONED, '$1$2 $1/$2')
    .match(/[\p{L}\p{N}]+/gu) ?? []) {
    const parts = run.replace(CASE_CHANGE, '$1 $2').split(' ');
    if (parts.length > 1) found.push(run);
    for (const part of parts) found.push(part);
  }
  return found;
}

/** The indexed terms of `text`, one per occurrence, in order. */
export function lexicalTokens(text: string): string[] {
  const terms: string[] = [];
  for (const word of words(text)) {
    const term = lexicalTerm(word);
    if (term !== null) terms.push(term);
  }
  return terms;
}

/** The distinct indexed terms of `text`. */
export function lexicalTerms(text: string): string[] {
  return [...new Set(lexicalTokens(text))];
}
