/**
 * Copies among a corpus's documents: a page saved twice (a license in every font folder, a README
 * beside its copy) and a page that compiles others whole (mdBook's `print.html`, Node's `all.html`,
 * Sphinx's single-page build). Left in, a copy competes with its original for every question and
 * the answer cites the compilation rather than the page on the subject.
 */
import type { Passage } from './passage.js';

/** A document's passages, as `chunkMarkdown` made them. */
export interface CorpusDocument {
  readonly file: string;
  readonly passages: readonly Passage[];
}

/** A copy left out: a whole document, or one passage of a compilation (`id`), and the document that keeps it. */
export interface Copy {
  readonly file: string;
  readonly id?: string;
  readonly original: string;
}

/** The share of a document's passages another must hold for it to be held whole (a page may be trimmed when compiled). */
const HELD_WHOLE = 0.9;
/** Documents a page must hold whole to be a compilation: pages sharing boilerplate hold a small one or two. */
const COMPILED = 3;
/** The share of a compilation's passages the documents it holds whole make up. */
const COMPILED_SHARE = 0.5;

/**
 * The documents without their copies, in the order given: of documents with the same passages
 * only the first is kept; a compilation (a document mostly made of at least three others held whole,
 * each of two passages or more and smaller than it) keeps only the passages no other document holds. Each copy
 * left out is reported to `onCopy`.
 */
export function withoutCopies(documents: readonly CorpusDocument[], onCopy: (copy: Copy) => void): CorpusDocument[] {
  const first = new Map<string, string>();
  const distinct: CorpusDocument[] = [];
  for (const document of documents) {
    const key = document.passages.map((p) => normal(p.text)).join('\u0000');
    const original = first.get(key);
    if (original === undefined || document.passages.length === 0) {
      first.set(key, document.file);
      distinct.push(document);
    } else onCopy({ file: document.file, original });
  }
  const holders = new Map<string, string[]>();
  const texts = new Map<string, Set<string>>();
  for (const { file, passages } of distinct) {
    const own = new Set(passages.map((p) => normal(p.text)));
    texts.set(file, own);
    for (const text of own) {
      const list = holders.get(text);
      if (list === undefined) holders.set(text, [file]);
      else list.push(file);
    }
  }
  // The passages each document alone holds: what it says itself.
  const alone = new Map<string, number>();
  for (const list of holders.values()) if (list.length === 1) alone.set(list[0]!, (alone.get(list[0]!) ?? 0) + 1);
  const compilations = new Set(distinct.filter(({ file }) => compiles(file, texts, holders, alone)).map(({ file }) => file));
  if (compilations.size === 0) return distinct;
  return distinct.map((document) => {
    if (!compilations.has(document.file)) return document;
    const passages = document.passages.filter((passage) => {
      const original = holders.get(normal(passage.text))!.find((file) => !compilations.has(file));
      if (original === undefined) return true;
      onCopy({ file: document.file, id: passage.id, original });
      return false;
    });
    return { file: document.file, passages };
  });
}

/**
 * Whether `file` compiles others: it holds at least three smaller documents (nearly) whole,
 * together most of it. A document of two passages or more is held whole when `file` holds nearly
 * all its passages, its own words among them: nearly all of those no third document holds. Pages
 * that include the same blocks (a command's common options) hold each other's shared passages,
 * never what each says alone.
 */
function compiles(
  file: string,
  texts: ReadonlyMap<string, ReadonlySet<string>>,
  holders: ReadonlyMap<string, readonly string[]>,
  alone: ReadonlyMap<string, number>,
): boolean {
  const own = texts.get(file)!;
  const shared = new Map<string, number>();
  const only = new Map<string, number>();
  for (const text of own) {
    const list = holders.get(text)!;
    for (const other of list) {
      if (other === file) continue;
      shared.set(other, (shared.get(other) ?? 0) + 1);
      if (list.length === 2) only.set(other, (only.get(other) ?? 0) + 1);
    }
  }
  let whole = 0;
  let mass = 0;
  for (const [other, count] of shared) {
    const size = texts.get(other)!.size;
    const exclusive = only.get(other) ?? 0;
    if (size >= 2 && size < own.size && count >= HELD_WHOLE * size && exclusive > 0 && exclusive >= HELD_WHOLE * (exclusive + (alone.get(other) ?? 0))) {
      whole++;
      mass += count;
    }
  }
  return whole >= COMPILED && mass >= COMPILED_SHARE * own.size;
}

/** A passage's text as compared: runs of whitespace as one space. */
function normal(text: string): string {
  return text.replace(/\s+/g, ' ').trim();
}
