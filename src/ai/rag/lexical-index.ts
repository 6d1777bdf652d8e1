/**
 * A BM25 index of passages (MiniSearch) beside the dense one: exact words, names and code that
 * an embedding blurs. It also knows each term's document frequency, so it can say how much of a
 * query's information (its IDF mass) a passage holds: the lexical evidence abstention weighs.
 */
import MiniSearch from 'minisearch';
import type { PassageMetadata } from './passage.js';
import { SectionIndex } from './section-index.js';
import { backgroundIdf, backgroundRate, loadBackground } from './background.js';
import { lexicalTerm, lexicalTerms, words } from './lexical-terms.js';
import { foldName, isCodeMember, joinedWords } from './names.js';
import { FileNames } from './file-names.js';

export { lexicalTerm, lexicalTerms, lexicalTokens } from './lexical-terms.js';

/** How much a word of a passage's headings or file name counts against one of its text: a heading names what the passage is about. */
const HEADING_BOOST = 3;

/** A path word names its documents for a question only while at most this share of the documents' paths hold it. */
const NAMING_SHARE = 0.1;

/** The shortest word that joins its neighbour into a compound (`compounds`). */
const COMPOUND_PART = 3;

/** Passages a section found stands for, those holding most of the query first: the answer may sit beside the best-covered one. */
const PASSAGES_PER_SECTION = 2;

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
  return fileOf(source).replace(/\.[A-Za-z]+$/, '');
}

/** The document a passage's source names (`guides/child-loggers.md › Levels` → `guides/child-loggers.md`). */
export function fileOf(source: string): string {
  return source.split(' › ')[0] ?? '';
}

/** Passages of everyday English a term's weight counts beside the corpus's own: its prior, strong for a small corpus, faint for a large one. */
const PRIOR_PASSAGES = 100;

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
  private readonly files = new FileNames();
  private readonly metadata = new Map<string, M>();
  private readonly termsOf = new Map<string, ReadonlySet<string>>();
  private readonly frequency = new Map<string, number>();
  /** For each term, the documents holding it and how many of their passages do. */
  private readonly documents = new Map<string, Map<string, number>>();
  /** Words joining parts (`coffee-script`, `node.js`), folded, and how many passages hold each: names written that way. */
  private readonly joined = new Map<string, number>();
  private readonly joinedOf = new Map<string, readonly string[]>();
  /** Every term, sorted, to find one starting with a name; made again after the terms change. */
  private sorted: string[] | undefined;
  /** Terms summed over passages (each passage's distinct ones): the mean passage length background IDF is taken at. */
  private termCount = 0;

  constructor() {
    loadBackground();
  }

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

  /**
   * The documents `question` names: a word of their path it says too (`stemmer/readme.md` for
   * "Can I load stemmer with require()?") that at most a tenth of the documents' paths hold.
   */
  namedFiles(question: string): ReadonlySet<string> {
    return this.files.named(question, NAMING_SHARE);
  }

  /** Indexes a passage's text, headings and file name under `id` (replacing one already there). */
  add(id: string, metadata: M): void {
    if (this.metadata.has(id)) this.remove(id);
    const headings = `${fileWords(metadata.source)}\n${metadata.headings ?? ''}`;
    this.engine.add({ id, text: metadata.text, headings });
    this.sections.add(id, metadata, headings);
    const terms = new Set(lexicalTerms(`${headings}\n${metadata.text}`));
    const file = fileOf(metadata.source);
    this.files.add(file);
    for (const term of terms) {
      this.frequency.set(term, (this.frequency.get(term) ?? 0) + 1);
      const held = this.documents.get(term) ?? new Map<string, number>();
      held.set(file, (held.get(file) ?? 0) + 1);
      this.documents.set(term, held);
    }
    this.termCount += terms.size;
    this.termsOf.set(id, terms);
    this.sorted = undefined;
    const joined = [...new Set(joinedWords(`${headings}\n${metadata.text}`))];
    for (const word of joined) this.joined.set(word, (this.joined.get(word) ?? 0) + 1);
    this.joinedOf.set(id, joined);
    this.metadata.set(id, metadata);
  }

  /** Removes `id`; returns whether it was there. */
  remove(id: string): boolean {
    const metadata = this.metadata.get(id);
    if (metadata === undefined) return false;
    this.engine.discard(id);
    this.sections.remove(id);
    const file = fileOf(metadata.source);
    this.files.remove(file);
    const terms = this.termsOf.get(id) ?? new Set<string>();
    this.termCount -= terms.size;
    for (const term of terms) {
      const n = (this.frequency.get(term) ?? 1) - 1;
      if (n === 0) this.frequency.delete(term);
      else this.frequency.set(term, n);
      const held = this.documents.get(term)!;
      const m = (held.get(file) ?? 1) - 1;
      if (m > 0) held.set(file, m);
      else if (held.delete(file) && held.size === 0) this.documents.delete(term);
    }
    for (const word of this.joinedOf.get(id) ?? []) {
      const n = (this.joined.get(word) ?? 1) - 1;
      if (n === 0) this.joined.delete(word);
      else this.joined.set(word, n);
    }
    this.joinedOf.delete(id);
    this.sorted = undefined;
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

  /**
   * The terms of this corpus that two adjacent words of `query` make written as one ("thread pool"
   * → `threadpool`, "file name" → `filenam`): documentation writes many a compound both ways.
   */
  compounds(query: string): string[] {
    const words = query.toLowerCase().match(/\p{L}+/gu) ?? [];
    const found = new Set<string>();
    for (let i = 0; i + 1 < words.length; i++) {
      // Short words joined make chance terms ("to do", "a pi").
      if (words[i]!.length < COMPOUND_PART || words[i + 1]!.length < COMPOUND_PART) continue;
      const term = lexicalTerm(words[i]! + words[i + 1]!);
      if (term !== null && this.frequency.has(term)) found.add(term);
    }
    return [...found];
  }

  /** How rare `term` is here (BM25's IDF): high for a term few passages hold, highest for one none holds. */
  idf(term: string): number {
    const n = this.metadata.size;
    const df = this.frequency.get(term) ?? 0;
    return Math.log(1 + (n - df + 0.5) / (df + 0.5));
  }

  /**
   * Whether some passage mentions the name `word` (`namesIn`): as a word of its own, as the start of
   * a longer one (`Postgres`, `PostgreSQL`), or written with joins (`CoffeeScript`, `coffee-script`);
   * a name with joins of its own (`Content-Type`) also by all its parts, a member in code (`fs.watch`)
   * only as itself.
   */
  mentions(word: string): boolean {
    const folded = foldName(word);
    if (folded === '' || this.joined.has(folded)) return true;
    // A member in code (`fs.watch`) is mentioned as itself: `fs` and "watch" apart say nothing of it.
    if (isCodeMember(word)) return false;
    const parts = word.split(/[.+#-]+/).filter((part) => part !== '');
    if (parts.length > 1 && parts.every((part) => this.mentions(part))) return true;
    const term = lexicalTerm(folded);
    if (term === null || this.frequency.has(term)) return true;
    if (term.length < 4) return false;
    this.sorted ??= [...this.frequency.keys()].sort();
    // The first term not below `term` starts with it if any does.
    let low = 0;
    let high = this.sorted.length;
    while (low < high) {
      const mid = (low + high) >>> 1;
      if (this.sorted[mid]! < term) low = mid + 1;
      else high = mid;
    }
    return this.sorted[low]?.startsWith(term) ?? false;
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
   * How much a query term says about its subject: its IDF here with `PRIOR_PASSAGES` passages of
   * everyday English added (`backgroundRate`: a few passages say little of how rare a word is, so
   * "handle", absent from 18 passages, is not rarer than the corpus's own subject), and no more than
   * its IDF over everyday English (`backgroundIdf`), so that a common word ("allowed", "going")
   * weighs little wherever it is rare.
   */
  weight(term: string): number {
    const length = this.termCount / Math.max(1, this.metadata.size);
    const n = this.metadata.size + PRIOR_PASSAGES;
    const df = (this.frequency.get(term) ?? 0) + PRIOR_PASSAGES * backgroundRate(term, length);
    return Math.min(Math.log(1 + (n - df + 0.5) / (df + 0.5)), backgroundIdf(term, length));
  }

  /**
   * The share of `query`'s information (its terms' `weight`s) that the passage `id` holds, from 0
   * to 1: 1 when it has every word of the query that says something, near 0 when it has only
   * the common ones. A query with no such word covers nothing.
   */
  coverage(query: string | readonly string[], id: string): number {
    const terms = typeof query === 'string' ? lexicalTerms(query) : query;
    let total = 0;
    let held = 0;
    for (const term of terms) {
      const weight = this.weight(term);
      total += weight;
      if (this.holds(id, term)) held += weight;
    }
    return total === 0 ? 0 : held / total;
  }

  /**
   * The share of `query`'s information (as `coverage` weighs it) each document holds (a file: its
   * passages together), for the documents holding any of it: whether the corpus has a page on what
   * the query asks about, whichever passages of it the words fall in.
   */
  documentShares(query: string | readonly string[]): Map<string, number> {
    const terms = typeof query === 'string' ? lexicalTerms(query) : query;
    let total = 0;
    const held = new Map<string, number>();
    for (const term of terms) {
      const weight = this.weight(term);
      total += weight;
      for (const file of this.documents.get(term)?.keys() ?? []) held.set(file, (held.get(file) ?? 0) + weight);
    }
    for (const [file, mass] of held) held.set(file, total === 0 ? 0 : mass / total);
    return held;
  }

  /** The largest of `documentShares`: 0 when no document holds any of the query. */
  documentCoverage(query: string | readonly string[]): number {
    let best = 0;
    for (const share of this.documentShares(query).values()) best = Math.max(best, share);
    return best;
  }
}
