/**
 * What a corpus file and a passage must be to be indexed: a document's bytes decoded as text
 * (UTF-8, or UTF-16 with its byte-order mark), and a passage with at least one word in it.
 * Anything else is a skip with a reason, never a failure of the whole corpus.
 */

/** Why a file or a passage of a corpus was left out of the index. */
export type CorpusSkipReason =
  /** A pattern of the folder's `.sluiceignore` or of the `ignore` option matches the file. */
  | 'ignored'
  /** The file could not be read (permissions, vanished while read). */
  | 'unreadable'
  /** Larger than `maxFileBytes`. */
  | 'too-large'
  /** A NUL byte in it: not a text document. */
  | 'binary'
  /** Not valid UTF-8 (nor UTF-16 with a byte-order mark, nor for an HTML page the charset it declares). */
  | 'not-utf8'
  /** Only punctuation, markup or whitespace: a `---` rule, an HTML comment, an empty code fence. */
  | 'no-text'
  /** The embedder gave no usable vector for it (all zeros, not finite, the wrong size), or failed on it alone. */
  | 'not-embeddable';

/** A file or passage left out of the index, and why. */
export interface CorpusSkip {
  readonly reason: CorpusSkipReason;
  /** The file, relative to the corpus folder (for passages given directly: the passage's source). */
  readonly file: string;
  /** The passage's id, for a skipped passage; undefined for a skipped file. */
  readonly id?: string;
  /** What was wrong, when there is more to say (the embedder's error). */
  readonly detail?: string;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** A charset an HTML page declares in its first 1,024 bytes (`<meta charset>` or its http-equiv form), as HTML's prescan reads it. */
const DECLARED_CHARSET = /<meta\b[^>]*?charset\s*=\s*["']?\s*([\w.:-]+)/i;

/**
 * The text of a document's bytes, or why it is not a text document. An HTML page (`html`) that is
 * not UTF-8 is read in the charset it declares, when it declares one the platform knows.
 */
export function decodeDocument(bytes: Uint8Array, html = false): { readonly text: string } | { readonly skip: 'binary' | 'not-utf8' } {
  // A byte-order mark names UTF-16, whose text is full of NUL bytes.
  if (bytes.length >= 2 && ((bytes[0] === 0xff && bytes[1] === 0xfe) || (bytes[0] === 0xfe && bytes[1] === 0xff))) {
    try {
      return { text: new TextDecoder(bytes[0] === 0xff ? 'utf-16le' : 'utf-16be', { fatal: true }).decode(bytes) };
    } catch {
      return { skip: 'not-utf8' };
    }
  }
  if (bytes.includes(0)) return { skip: 'binary' };
  try {
    return { text: utf8.decode(bytes) };
  } catch {
    const charset = html ? DECLARED_CHARSET.exec(new TextDecoder('latin1').decode(bytes.subarray(0, 1024)))?.[1] : undefined;
    if (charset === undefined) return { skip: 'not-utf8' };
    try {
      return { text: new TextDecoder(charset).decode(bytes) };
    } catch {
      // A label the platform does not know (RangeError).
      return { skip: 'not-utf8' };
    }
  }
}

const MARKUP = /<!--[\s\S]*?(?:-->|$)|<\/?[A-Za-z][^>]*>/g;

/** Whether a passage has a word to embed: a letter or a digit outside HTML comments and tags. */
export function hasText(text: string): boolean {
  return /[\p{L}\p{N}]/u.test(text.replace(MARKUP, ' ').normalize('NFKD').replace(/\p{M}/gu, ''));
}

/** A vector an index can hold: `dim` finite components (when `dim` is known), not all zero. */
export function usableVector(vector: ArrayLike<number> | undefined, dim: number | undefined): vector is ArrayLike<number> {
  if (vector === undefined || vector === null || typeof vector.length !== 'number') return false;
  if (vector.length === 0 || (dim !== undefined && vector.length !== dim)) return false;
  let sum = 0;
  for (let i = 0; i < vector.length; i++) {
    const x = vector[i]!;
    if (typeof x !== 'number') return false;
    if (!Number.isFinite(x)) return false;
    sum += x * x;
  }
  return sum > 0 && Number.isFinite(sum);
}
