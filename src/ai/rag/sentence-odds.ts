/**
 * How likely a sentence of the retrieved passages is to answer the question, as log-odds: a
 * weighted sum of what is known of it. The weights were fitted (a listwise logistic regression,
 * each question's sentences against each other) to which sentences hold the answer over the
 * question sets of `npm run eval`, and hold with any one corpus left out of the fit
 * (docs/internals/eval-figures.md).
 */

/** What is known of one sentence when choosing the answer. */
export interface AnswerSignals {
  /** Its BM25 over the query's words, as a share of the query's IDF mass (`SentenceMatch.score`). */
  readonly lexical: number;
  /** Its meaning's cosine to the question's. */
  readonly cosine: number;
  /** The share of the kind of value the question asks for that it holds (`answerShare`; 0 when it holds no query word). */
  readonly kind: number;
  /** It is a line of code alone. */
  readonly code: boolean;
  /** Retrieval's rank of its passage, from 0 (a section's pieces rank beside its best one). */
  readonly place: number;
  /** Its passage was not retrieved itself but neighbours one that was. */
  readonly neighbour: boolean;
  /** The share of the query's terms it holds, in its text or its headings. */
  readonly held: number;
  /** The share of the query's terms its text holds itself. */
  readonly own: number;
  /** Its indexed terms. */
  readonly length: number;
  /** The question asks how to do something and it names something in code (an option, a function, a command). */
  readonly names: boolean;
  /** The question asks how to do something and it is a line of code alone. */
  readonly howToCode: boolean;
}

/** Each signal's weight in the log-odds. */
const WEIGHTS = {
  lexical: 4.22,
  cosine: 1.15,
  kind: 3.43,
  code: -0.92,
  place: -0.95,
  neighbour: -0.56,
  held: 2.94,
  own: -0.65,
  length: 0.91,
  names: 1.82,
  howToCode: 0.83,
} as const;

/** The log-odds that the sentence described by `s` answers the question (up to a constant shared by all its sentences). */
export function answerOdds(s: AnswerSignals): number {
  return (
    WEIGHTS.lexical * s.lexical +
    WEIGHTS.cosine * s.cosine +
    WEIGHTS.kind * s.kind +
    (s.code ? WEIGHTS.code : 0) +
    WEIGHTS.place * Math.log1p(s.place) +
    (s.neighbour ? WEIGHTS.neighbour : 0) +
    WEIGHTS.held * s.held +
    WEIGHTS.own * s.own +
    WEIGHTS.length * Math.log1p(s.length) +
    (s.names ? WEIGHTS.names : 0) +
    (s.howToCode ? WEIGHTS.howToCode : 0)
  );
}
