/**
 * An answer made only of what was retrieved: the sentences of the top passages closest to
 * the question (ranked with the embedding model), in reading order, each followed by the
 * `[n]` of its source, then the list of sources. It never says more than the sources say.
 */
import { cosineSimilarity } from '../../cache/semantic.js';
import type { RetrievedPassage } from './passage.js';

/** Options of the extractive answer a `ragWorker` gives without a generator. */
export interface ExtractOptions {
  /** Sentences in an answer at most. Default 3. */
  readonly sentences?: number;
  /** A sentence below this cosine similarity to the question is left out. Default 0.2. */
  readonly minScore?: number;
}

export interface ExtractedAnswer {
  /** The answer with its `[n]` citations and the source list; the no-answer sentence when nothing matched. */
  readonly text: string;
  /** The passages cited, `[1]` first. */
  readonly sources: readonly RetrievedPassage[];
}

/** What the answer says when nothing retrieved is close enough. */
export const NO_ANSWER = 'I found nothing about that in the documents I have.';

const segmenter = new Intl.Segmenter('en', { granularity: 'sentence' });

/** A passage's sentences, trimmed, without headings, code blocks, table rows or list markers; fragments of fewer than 4 words dropped. */
export function sentencesOf(text: string): string[] {
  // Blocks: paragraphs and list items, so a sentence never runs from one into the next.
  const blocks: string[] = [];
  let current: string[] = [];
  let fenced = false;
  const close = () => {
    if (current.length > 0) blocks.push(current.join(' '));
    current = [];
  };
  for (const line of text.split('\n')) {
    if (/^\s*(```|~~~)/.test(line)) {
      fenced = !fenced;
      close();
      continue;
    }
    if (fenced || /^\s*(#|\|)/.test(line) || line.trim() === '') {
      close();
      continue;
    }
    const item = /^\s*([-*+]|\d+\.)\s+/.exec(line);
    if (item !== null) close();
    current.push(item === null ? line.trim() : line.slice(item[0].length).trim());
  }
  close();
  const sentences: string[] = [];
  for (const block of blocks) {
    for (const { segment } of segmenter.segment(block)) {
      // The segmenter keeps "… `OverflowError`. `conflate` merges …" together: split before a code span too.
      for (const part of segment.split(/(?<=[.!?])\s+(?=[`[(A-Z])/)) {
        const sentence = part.replace(/\s+/g, ' ').trim();
        if (sentence.split(' ').length >= 4) sentences.push(sentence);
      }
    }
  }
  return sentences;
}

/**
 * Picks the sentences closest to `question` among the passages' (vectors from the same
 * embedder), and writes the answer: in passage order, then sentence order, each followed by
 * its source's number.
 */
export function composeAnswer(
  question: Float32Array,
  passages: readonly RetrievedPassage[],
  candidates: readonly { readonly passage: number; readonly position: number; readonly text: string }[],
  vectors: readonly Float32Array[],
  options: ExtractOptions = {},
): ExtractedAnswer {
  const limit = options.sentences ?? 3;
  const minScore = options.minScore ?? 0.2;
  const picked = candidates
    .map((candidate, i) => ({ ...candidate, score: cosineSimilarity(question, vectors[i]!) }))
    .filter((c) => c.score >= minScore)
    .sort((a, b) => b.score - a.score)
    .slice(0, limit)
    .sort((a, b) => a.passage - b.passage || a.position - b.position);
  if (picked.length === 0) return { text: NO_ANSWER, sources: [] };
  const cited = [...new Set(picked.map((p) => p.passage))];
  const number = new Map(cited.map((passage, i) => [passage, i + 1]));
  const body = picked.map((p) => `${p.text} [${number.get(p.passage)}]`).join(' ');
  const sources = cited.map((passage) => passages[passage]!);
  const list = sources.map((s, i) => `[${i + 1}] ${s.source}`).join('\n');
  return { text: `${body}\n\nSources:\n${list}`, sources };
}

/** The sentences of `passages` to rank, each with where it came from. */
export function candidatesOf(passages: readonly RetrievedPassage[]): { readonly passage: number; readonly position: number; readonly text: string }[] {
  return passages.flatMap((p, passage) => sentencesOf(p.text).map((text, position) => ({ passage, position, text })));
}

/** An answer cut into the pieces it is streamed in: words with the space that follows them. */
export function answerPieces(text: string): string[] {
  return text.match(/\S+\s*/g) ?? [];
}
