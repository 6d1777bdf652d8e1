/**
 * BM25 over heading sections rather than single paragraphs: a question's words are often spread
 * over a section's heading, its prose and its code, none holding them all. Each section (same file
 * and heading path) is indexed as windows of consecutive passages, bounded in size so a long section
 * does not drown its words; a window found is mapped back to the passages it holds.
 */
import MiniSearch from 'minisearch';
import type { PassageMetadata } from './passage.js';

/** Characters of passage text in one window at most (one long passage may exceed it alone). */
export const SECTION_WINDOW_CHARS = 2400;

/** A window of a section found for a query: its BM25 score and its passages, in document order. */
export interface SectionHit {
  readonly score: number;
  readonly passages: readonly string[];
}

interface Window {
  readonly id: number;
  readonly text: string;
  readonly headings: string;
}

/** The section a passage belongs to: its source (file › nearest heading) and heading path. */
const sectionOf = (metadata: PassageMetadata): string => `${metadata.source}\n${metadata.headings ?? ''}`;

/**
 * Sections of passages in a BM25 index, kept in step as passages are added and removed (windows
 * are rebuilt lazily, at the next search). Tokenized like `LexicalIndex`, whose options it takes.
 */
export class SectionIndex {
  private readonly engine: MiniSearch<Window>;
  private readonly members = new Map<string, Map<string, { readonly text: string; readonly headings: string }>>();
  private readonly sectionOfPassage = new Map<string, string>();
  private readonly windowsOf = new Map<string, { readonly id: number; readonly passages: readonly string[] }[]>();
  private readonly passagesOfWindow = new Map<number, readonly string[]>();
  private readonly dirty = new Set<string>();
  private nextWindow = 0;

  constructor(tokenize: (text: string) => string[], processTerm: (term: string) => string | null, headingBoost: number) {
    this.engine = new MiniSearch<Window>({ fields: ['text', 'headings'], tokenize, processTerm, searchOptions: { boost: { headings: headingBoost } } });
  }

  /** Adds a passage to its section (after the ones already there); `headings` is the text its section's headings are searched by. */
  add(id: string, metadata: PassageMetadata, headings: string): void {
    const section = sectionOf(metadata);
    let members = this.members.get(section);
    if (members === undefined) this.members.set(section, (members = new Map()));
    members.set(id, { text: metadata.text, headings });
    this.sectionOfPassage.set(id, section);
    this.dirty.add(section);
  }

  /** Removes a passage from its section. */
  remove(id: string): void {
    const section = this.sectionOfPassage.get(id);
    if (section === undefined) return;
    this.sectionOfPassage.delete(id);
    const members = this.members.get(section)!;
    members.delete(id);
    if (members.size === 0) this.members.delete(section);
    this.dirty.add(section);
  }

  /** The `k` windows that best match `query`, best first (BM25; ties by document order). */
  search(query: string, k: number): SectionHit[] {
    this.flush();
    return this.engine
      .search(query)
      .sort((a, b) => b.score - a.score || (a.id as number) - (b.id as number))
      .slice(0, k)
      .map((result) => ({ score: result.score, passages: this.passagesOfWindow.get(result.id as number)! }));
  }

  /** Re-indexes the windows of every section changed since the last search. */
  private flush(): void {
    for (const section of this.dirty) {
      for (const window of this.windowsOf.get(section) ?? []) {
        this.engine.discard(window.id);
        this.passagesOfWindow.delete(window.id);
      }
      this.windowsOf.delete(section);
      const members = this.members.get(section);
      if (members !== undefined) this.windowsOf.set(section, this.index(members));
    }
    this.dirty.clear();
  }

  /** Indexes a section's passages as windows of whole passages, each at most `SECTION_WINDOW_CHARS` long. */
  private index(members: ReadonlyMap<string, { readonly text: string; readonly headings: string }>): { id: number; passages: string[] }[] {
    const windows: { id: number; passages: string[]; texts: string[]; chars: number }[] = [];
    let headings = '';
    for (const [id, metadata] of members) {
      headings = metadata.headings;
      const last = windows.at(-1);
      if (last !== undefined && last.chars + metadata.text.length <= SECTION_WINDOW_CHARS) {
        last.passages.push(id);
        last.texts.push(metadata.text);
        last.chars += metadata.text.length;
      } else windows.push({ id: this.nextWindow++, passages: [id], texts: [metadata.text], chars: metadata.text.length });
    }
    for (const window of windows) {
      this.engine.add({ id: window.id, text: window.texts.join('\n\n'), headings });
      this.passagesOfWindow.set(window.id, window.passages);
    }
    return windows.map(({ id, passages }) => ({ id, passages }));
  }
}
