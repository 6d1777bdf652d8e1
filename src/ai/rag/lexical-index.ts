/**
 * A BM25 index of passages (MiniSearch) beside the dense one: exact words, names and code that
 * an embedding blurs. It also knows each term's document frequency, so it can say how much of a
 * query's information (its IDF mass) a passage holds: the lexical evidence abstention weighs.
 */
import MiniSearch from 'minisearch';
import { stemmer } from 'stemmer';
import type { PassageMetadata } from './passage.js';
import { SectionIndex } from './section-index.js';
import { TextMemo } from './text-memo.js';

/** Function words that carry no subject: never indexed, never asked for. */
const STOP_WORDS = new Set(
  (
    'a an and are as at be been but by can could did do does doing for from had has have how i if in into is it its ' +
    'me my no not of on or our should so than that the their them then there these they this those to too was we ' +
    'were what when where which while who whom why will with would you your yours about after before all any each ' +
    'more most other some such several every few various only own same just also very s t don get got use used using one many much long often ' +
    'happen happens mean means work works need want tell explain example way possible'
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

function termOf(word: string): string | null {
  const term = word.toLowerCase().normalize('NFKD').replace(/\p{M}/gu, '');
  // A lone digit is a version or a count (`fast-check 4`); a lone letter says nothing.
  if ((term.length < 2 && !/^\p{N}$/u.test(term)) || STOP_WORDS.has(term)) return null;
  if (!/^\p{L}+$/u.test(term)) return term; // numbers, identifiers with digits: as they are
  const stem = stemmer(term);
  return stem.length > 5 && stem.endsWith('er') ? stem.slice(0, -2) : stem;
}

/** How much a word of a passage's headings or file name counts against one of its text: a heading names what the passage is about. */
const HEADING_BOOST = 3;

/** Passages a section found stands for, those holding most of the query first: the answer may sit beside the best-covered one. */
const PASSAGES_PER_SECTION = 2;

/** HTML comments and tags: their attributes (`<div align="center">`) say nothing about the subject. */
const MARKUP = /<!--[\s\S]*?(?:-->|$)|<\/?[A-Za-z][^>]*>/g;

/** Words of a text: runs of letters and digits (code identifiers split at `_`, `-`, `.` and case changes), outside HTML tags. */
function words(text: string): string[] {
  const split = text.replace(MARKUP, ' ').replace(/([\p{Ll}\p{N}])(\p{Lu})/gu, '$1 $2');
  return split.match(/[\p{L}\p{N}]+/gu) ?? [];
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

/** A term added to a query (an indexed term), with its weight relative to the query's own terms (which weigh 1). */
export interface ExpansionTerm {
  readonly term: string;
  readonly weight: number;
}

/** A passage found by its words, with its BM25 score. */
export interface LexicalHit<M extends PassageMetadata = PassageMetadata> {
  readonly id: string;
  readonly score: number;
  readonly metadata: M;
}

interface Indexed {
  readonly id: string;
  readonly text: string;
  readonly headings: string;
}

/** The words of a passage's file path (`guides/child-loggers.md` → `guides child loggers`): documents are named by their subject. */
function fileWords(source: string): string {
  return (source.split(' › ')[0] ?? '').replace(/\.[A-Za-z]+$/, '');
}

/**
 * BM25 over passages' text and heading paths with their file's name (these count three times), with the document
 * frequency of every term for `coverage`. Build it from passages or from a `VectorIndex`'s entries.
 *
 * ## Example
 * ```ts
 * const lexical = LexicalIndex.of([{ id: 'a#1', text: 'Run `npm install rxjs` first.', source: 'a.md', headings: 'Install' }]);
 * lexical.search('install rxjs', 3); // [{ id: 'a#1', score: …, metadata: … }]
 * lexical.coverage('how do I install rxjs', 'a#1'); // 1: every word that says something is there
 * ```
 */
export class LexicalIndex<M extends PassageMetadata = PassageMetadata> {
  private readonly engine = new MiniSearch<Indexed>({
    fields: ['text', 'headings'],
    tokenize: words,
    processTerm: lexicalTerm,
    searchOptions: { boost: { headings: HEADING_BOOST } },
  });
  private readonly sections = new SectionIndex(words, lexicalTerm, HEADING_BOOST);
  private readonly metadata = new Map<string, M>();
  private readonly termsOf = new Map<string, ReadonlySet<string>>();
  private readonly frequency = new Map<string, number>();

  /** An index of `entries` (passages, or `VectorIndex.entries()`). */
  static of<M extends PassageMetadata>(entries: Iterable<{ readonly id: string; readonly metadata: M } | (M & { readonly id: string })>): LexicalIndex<M> {
    const index = new LexicalIndex<M>();
    for (const entry of entries) {
      if ('metadata' in entry) index.add(entry.id, entry.metadata);
      else {
        const { id, ...metadata } = entry;
        index.add(id, metadata as unknown as M);
      }
    }
    return index;
  }

  /** Passages held. */
  get size(): number {
    return this.metadata.size;
  }

  /** Indexes a passage's text, headings and file name under `id` (replacing one already there). */
  add(id: string, metadata: M): void {
    if (this.metadata.has(id)) this.remove(id);
    const headings = `${fileWords(metadata.source)}\n${metadata.headings ?? ''}`;
    this.engine.add({ id, text: metadata.text, headings });
    this.sections.add(id, metadata, headings);
    const terms = new Set(lexicalTerms(`${headings}\n${metadata.text}`));
    for (const term of terms) this.frequency.set(term, (this.frequency.get(term) ?? 0) + 1);
    this.termsOf.set(id, terms);
    this.metadata.set(id, metadata);
  }

  /** Removes `id`; returns whether it was there. */
  remove(id: string): boolean {
    const metadata = this.metadata.get(id);
    if (metadata === undefined) return false;
    this.engine.discard(id);
    this.sections.remove(id);
    for (const term of this.termsOf.get(id) ?? []) {
      const n = (this.frequency.get(term) ?? 1) - 1;
      if (n === 0) this.frequency.delete(term);
      else this.frequency.set(term, n);
    }
    this.termsOf.delete(id);
    this.metadata.delete(id);
    return true;
  }

  /** The `k` passages that best match `query`'s words (and the `expansion` terms, at their weights), best first (BM25; ties by id). */
  search(query: string, k: number, filter?: (metadata: M) => boolean, expansion: readonly ExpansionTerm[] = []): LexicalHit<M>[] {
    const weights = new Map(expansion.map((e) => [e.term, e.weight]));
    // Feedback terms are indexed terms already: searched as they are, each at its weight, beside the query's own words.
    const expanded = {
      combineWith: 'OR' as const,
      queries: [query, { queries: [...weights.keys()], processTerm: (term: string) => term, boostTerm: (term: string) => weights.get(term) ?? 0 }],
    };
    const hits: LexicalHit<M>[] = [];
    for (const result of this.engine.search(weights.size === 0 ? query : expanded)) {
      const metadata = this.metadata.get(result.id as string)!;
      if (filter === undefined || filter(metadata)) hits.push({ id: result.id as string, score: result.score, metadata });
    }
    return hits.sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)).slice(0, k);
  }

  /**
   * The `k` passages that best answer `query` by their section: heading sections (bounded windows of
   * them) ranked by BM25, each standing for the two passages in it that hold the most of the query's
   * IDF mass (ties in document order), passages failing `filter` left out.
   */
  searchSections(query: string, k: number, filter?: (metadata: M) => boolean): LexicalHit<M>[] {
    const terms = lexicalTerms(query);
    const hits: LexicalHit<M>[] = [];
    const seen = new Set<string>();
    for (const section of this.sections.search(query, 2 * k)) {
      const members = section.passages
        .filter((id) => !seen.has(id) && (filter === undefined || filter(this.metadata.get(id)!)))
        .map((id, at) => ({ id, at, held: this.coverage(terms, id) }))
        .sort((a, b) => b.held - a.held || a.at - b.at);
      for (const { id } of members.slice(0, PASSAGES_PER_SECTION)) {
        seen.add(id);
        hits.push({ id, score: section.score, metadata: this.metadata.get(id)! });
        if (hits.length === k) return hits;
      }
    }
    return hits;
  }

  /** How rare `term` is here (BM25's IDF): high for a term few passages hold, highest for one none holds. */
  idf(term: string): number {
    const n = this.metadata.size;
    const df = this.frequency.get(term) ?? 0;
    return Math.log(1 + (n - df + 0.5) / (df + 0.5));
  }

  /** Whether a passage holds the term. */
  holds(id: string, term: string): boolean {
    return this.termsOf.get(id)?.has(term) ?? false;
  }

  /**
   * How sharply the query words the passage `id` holds single it out: their IDF mass over ln n, for
   * n passages. Under independence about n·e^(−mass) passages would hold them all by chance, so at 1
   * about one passage would, and above 1 fewer than one. 0 with fewer than two passages.
   */
  specificity(query: string | readonly string[], id: string): number {
    if (this.metadata.size < 2) return 0;
    const terms = typeof query === 'string' ? lexicalTerms(query) : query;
    let held = 0;
    for (const term of terms) if (this.holds(id, term)) held += this.idf(term);
    return held / Math.log(this.metadata.size);
  }

  /**
   * The share of `query`'s IDF mass that the passage `id` holds, in [0, 1]: 1 when it has every
   * word of the query that says something, near 0 when it has only the common ones. A query
   * with no such word covers nothing.
   */
  coverage(query: string | readonly string[], id: string): number {
    const terms = typeof query === 'string' ? lexicalTerms(query) : query;
    let total = 0;
    let held = 0;
    for (const term of terms) {
      const weight = this.idf(term);
      total += weight;
      if (this.holds(id, term)) held += weight;
    }
    return total === 0 ? 0 : held / total;
  }
}
