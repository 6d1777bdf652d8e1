/**
 * Documents named by a question: a word of a document's path (`stemmer/readme.md`,
 * `api/RetryAgent.md`, `docs/redaction.md`) that the question says too, and that few paths
 * share, names what the document is about. Words are matched whole and unstemmed
 * (`RetryAgent` is `retryagent`), so "agents" names no file called `Agent.md`.
 */
import { lexicalTerm } from './lexical-terms.js';

/** The subject words of a path or a question: lower-case runs of letters and digits, without function words, lone letters and numbers (`01-intro` orders, it does not name). */
export function subjectWords(text: string): string[] {
  return (text.toLowerCase().match(/[\p{L}\p{N}]+/gu) ?? []).filter((word) => !/^\p{N}+$/u.test(word) && lexicalTerm(word) !== null);
}

/** The words of a document's path, without its extension (and `.gz`). */
const pathWords = (file: string): Set<string> => new Set(subjectWords(file.replace(/\.gz$/i, '').replace(/\.[A-Za-z]+$/, '')));

/** The documents of a corpus and the words of their paths, kept as passages come and go. */
export class FileNames {
  /** Passages held per document. */
  private readonly passages = new Map<string, number>();
  private readonly wordsOf = new Map<string, ReadonlySet<string>>();
  /** For each word, the documents whose path holds it. */
  private readonly holders = new Map<string, Set<string>>();

  /** Documents held. */
  get size(): number {
    return this.passages.size;
  }

  /** Counts a passage of `file`. */
  add(file: string): void {
    const held = this.passages.get(file) ?? 0;
    this.passages.set(file, held + 1);
    if (held > 0) return;
    const words = pathWords(file);
    this.wordsOf.set(file, words);
    for (const word of words) {
      const files = this.holders.get(word) ?? new Set<string>();
      files.add(file);
      this.holders.set(word, files);
    }
  }

  /** Forgets a passage of `file`; the document goes with its last passage. */
  remove(file: string): void {
    const held = this.passages.get(file);
    if (held === undefined) return;
    if (held > 1) {
      this.passages.set(file, held - 1);
      return;
    }
    this.passages.delete(file);
    for (const word of this.wordsOf.get(file) ?? []) {
      const files = this.holders.get(word)!;
      files.delete(file);
      if (files.size === 0) this.holders.delete(word);
    }
    this.wordsOf.delete(file);
  }

  /**
   * The documents whose path holds a word of `question` that the paths of at most `share` of the
   * documents hold (at least one): a word every page's path has (`docs`, the package's name) names none.
   */
  named(question: string, share: number): ReadonlySet<string> {
    const named = new Set<string>();
    if (this.passages.size < 2) return named;
    const most = Math.max(1, Math.floor(share * this.passages.size));
    for (const word of new Set(subjectWords(question))) {
      const files = this.holders.get(word);
      if (files !== undefined && files.size <= most) for (const file of files) named.add(file);
    }
    return named;
  }
}
