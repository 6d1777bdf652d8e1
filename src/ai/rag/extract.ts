/**
 * An answer made only of what was retrieved: the sentences, code lines and table rows of the top
 * passages closest to the question (ranked by the embedding model and by the words they share
 * with it), in reading order, each followed by the `[n]` of its source, then the list of sources.
 * It never says more than the sources say.
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

/** A table row's cells, trimmed, without the outer pipes. */
function cells(row: string): string[] {
  return row
    .trim()
    .replace(/^\||\|$/g, '')
    .split('|')
    .map((cell) => cell.trim());
}

const TABLE_SEPARATOR = /^\s*\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*$/;

/** A table row as a sentence: each cell after its column's header (`Code: 429; Meaning: rate limited`). */
function rowSentence(header: readonly string[] | undefined, row: string): string {
  const values = cells(row);
  if (header === undefined) return values.filter((v) => v !== '').join('; ');
  return values
    .map((value, i) => (header[i] ? `${header[i]}: ${value}` : value))
    .filter((_, i) => values[i] !== '')
    .join('; ');
}

/** A code line worth quoting: something to run or read, not a brace, a blank or a lone comment marker. */
function codeSentence(line: string): string | undefined {
  const code = line.trim();
  if (code.length > 160 || (code.match(/[\p{L}\p{N}]+/gu) ?? []).length < 2) return undefined;
  return `\`${code.replace(/`/g, "'")}\``;
}

/**
 * A passage's sentences, trimmed: prose split into sentences (fragments of fewer than 4 words
 * dropped, list markers and headings left out), each line of a code fence as a code span, and
 * each table row with its header's cells named, so a command or a row can be the quoted answer;
 * a sentence ending in `:` keeps the first code line or row it introduces.
 */
export function sentencesOf(text: string): string[] {
  // Blocks: paragraphs and list items, so a sentence never runs from one into the next.
  const blocks: string[] = [];
  const quotable: (string | number)[] = []; // a code line or table row as it is, or the index of a prose block
  let current: string[] = [];
  let fenced = false;
  let header: string[] | undefined;
  const close = () => {
    if (current.length > 0) {
      quotable.push(blocks.length);
      blocks.push(current.join(' '));
    }
    current = [];
  };
  const lines = text.split('\n');
  for (const [i, line] of lines.entries()) {
    if (/^\s*(```|~~~)/.test(line)) {
      fenced = !fenced;
      close();
      continue;
    }
    if (fenced) {
      const code = codeSentence(line);
      if (code !== undefined) quotable.push(code);
      continue;
    }
    if (/^\s*\|/.test(line)) {
      close();
      if (TABLE_SEPARATOR.test(line)) continue;
      // A row followed by the separator is the header: it names the cells of the rows below.
      if (TABLE_SEPARATOR.test(lines[i + 1] ?? '')) header = cells(line);
      else quotable.push(rowSentence(header, line));
      continue;
    }
    header = undefined;
    // A heading, a blank, or a link reference definition (`[docs]: https://…`): nothing to quote.
    if (/^\s*#{1,6}\s/.test(line) || line.trim() === '' || /^\s*\[[^\]]+\]:\s*\S+/.test(line)) {
      close();
      continue;
    }
    const item = /^\s*([-*+]|\d+\.)\s+/.exec(line);
    if (item !== null) close();
    current.push(item === null ? line.trim() : line.slice(item[0].length).trim());
  }
  close();
  const sentences: string[] = [];
  let leadIn = false; // the last sentence ends in `:`: the code line or row after it is what it introduces
  for (const entry of quotable) {
    if (typeof entry === 'string') {
      if (entry.length === 0) continue;
      if (leadIn) sentences.push(`${sentences.pop()!} ${entry}`);
      else sentences.push(entry);
      leadIn = false;
      continue;
    }
    leadIn = false;
    // Code spans and abbreviations are masked while splitting, so `nak(millis?)` or "e.g. 30" never ends a sentence.
    const masked: string[] = [];
    const block = blocks[entry]!.replace(/`[^`]*`|\b(?:e\.g|i\.e|etc|vs|cf)\./g, (span) => `\u{E000}${masked.push(span) - 1}\u{E001}`);
    const unmask = (text: string) => text.replace(/\u{E000}(\d+)\u{E001}/gu, (_, i: string) => masked[Number(i)]!);
    for (const { segment } of segmenter.segment(block)) {
      // The segmenter keeps "… `OverflowError`. `conflate` merges …" together: split before a code span too.
      for (const part of segment.split(/(?<=[.!?])\s+(?=[\u{E000}[(A-Z])/u)) {
        const sentence = unmask(part).replace(/\s+/g, ' ').trim();
        if (sentence.split(' ').length < 4) continue;
        sentences.push(sentence);
        leadIn = sentence.endsWith(':');
      }
    }
  }
  return sentences;
}

/** Link targets: words of a URL are no evidence that a sentence answers. */
const URL = /\bhttps?:\/\/\S+/g;
/** How much a lone code line's score counts, beside prose and table rows. */
const CODE_WEIGHT = 0.75;

/** Whether a candidate is a lone code line (a lead-in sentence with its line is prose). */
function isCode(text: string): boolean {
  return text.startsWith('`') && text.endsWith('`') && !text.slice(1, -1).includes('`');
}

/** The query's words and how much each says (e.g. a `LexicalIndex`'s IDF), to rank sentences by overlap too. */
export interface QueryTerms {
  readonly terms: readonly string[];
  readonly weight: (term: string) => number;
  /** The indexed terms of a text, as the query's were made. */
  readonly termsOf: (text: string) => readonly string[];
}

/**
 * Picks the sentences closest to `question` among the passages' (vectors from the same
 * embedder), and writes the answer: in passage order, then sentence order, each followed by its source's number. With `words`,
 * a sentence's score is the mean of its cosine and the share of the query's weight its words
 * (and its passage's headings) hold, and a sentence under half the best score is left out.
 */
export function composeAnswer(
  question: Float32Array,
  passages: readonly RetrievedPassage[],
  candidates: readonly { readonly passage: number; readonly position: number; readonly text: string }[],
  vectors: readonly Float32Array[],
  options: ExtractOptions = {},
  words?: QueryTerms,
): ExtractedAnswer {
  const limit = options.sentences ?? 3;
  const minScore = options.minScore ?? 0.2;
  const overlap = (text: string, passage: number): number => {
    if (words === undefined) return 0;
    const held = new Set([...words.termsOf(text), ...words.termsOf(passages[passage]?.headings ?? '')]);
    let total = 0;
    let found = 0;
    for (const term of words.terms) {
      total += words.weight(term);
      if (held.has(term)) found += words.weight(term);
    }
    return total === 0 ? 0 : found / total;
  };
  const seen = new Set<string>();
  const scored = candidates
    .map((candidate, i) => {
      const cosine = cosineSimilarity(question, vectors[i]!);
      if (words === undefined) return { ...candidate, score: cosine };
      const score = (cosine + overlap(candidate.text.replace(URL, ' '), candidate.passage)) / 2;
      // A line of code alone shares the names of a whole section (imports, constructors): it must hold more to be quoted.
      return { ...candidate, score: isCode(candidate.text) ? score * CODE_WEIGHT : score };
    })
    .filter((c) => c.score >= minScore)
    .sort((a, b) => b.score - a.score)
    .filter((c) => !seen.has(c.text) && seen.add(c.text) !== undefined);
  const best = scored[0]?.score ?? 0;
  const kept = scored.filter((c) => words === undefined || c.score >= best / 2).slice(0, limit);
  if (kept.length === 0) return { text: NO_ANSWER, sources: [] };
  // Retrieval's order (best passage first), then reading order.
  const picked = kept.sort((a, b) => a.passage - b.passage || a.position - b.position);
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
