/**
 * What a corpus file and a passage must be to be indexed: a document's bytes decoded as text
 * (UTF-8, UTF-16 with its byte-order mark, or a legacy charset an HTML page declares or the bytes
 * show), and a passage with at least one word in it. Anything else is a skip with a reason, never
 * a failure of the whole corpus.
 */
import { createRequire } from 'node:module';

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
  /** Not valid UTF-8, nor UTF-16 with a byte-order mark, nor in a charset the page declares or its bytes show clearly enough to read. */
  | 'not-utf8'
  /** Only punctuation, markup or whitespace: a `---` rule, an HTML comment, an empty code fence; for a file, an empty one. */
  | 'no-text'
  /** A copy of another document (the same passages), or a passage of a page compiling others (`print.html`) that the page on its subject holds. */
  | 'duplicate'
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

/** How sure (0–100) chardet must be of a charset to read a file in it: text scores 50–100 there, random bytes under 10. */
const DETECTED = 25;

type Analyse = (bytes: Uint8Array) => readonly { readonly name: string; readonly confidence: number }[];
let analyse: Analyse | undefined;

/** A close second that is still chosen when it is Latin-1: single-byte charsets are told apart by letter statistics, unsure over a few lines. */
const NEAR_TIE = 0.8;

/** The legacy charset the bytes are most likely in (windows-1252, Shift_JIS, GB18030...), when chardet is sure enough of it. */
function detectedCharset(bytes: Uint8Array): string | undefined {
  analyse ??= (createRequire(import.meta.url)('chardet') as { analyse: Analyse }).analyse;
  const matches = analyse(bytes.subarray(0, 64 * 1024));
  const best = matches[0];
  if (best === undefined || best.confidence < DETECTED) return undefined;
  // The commonest legacy charset by far wins a near tie.
  const latin = matches.find((m) => m.name === 'ISO-8859-1' || m.name === 'windows-1252');
  return latin !== undefined && latin.confidence >= NEAR_TIE * best.confidence ? latin.name : best.name;
}

/**
 * The text of a document's bytes, or why it is not a text document. Bytes that are not UTF-8 are
 * read in the charset an HTML page (`html`) declares, else in the one their bytes show, when the
 * platform knows it: a Latin-1 or Shift_JIS text is a document too.
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
    const declared = html ? DECLARED_CHARSET.exec(new TextDecoder('latin1').decode(bytes.subarray(0, 1024)))?.[1] : undefined;
    const text = (declared === undefined ? undefined : decodeAs(bytes, declared)) ?? decodeAs(bytes, detectedCharset(bytes));
    return text === undefined ? { skip: 'not-utf8' } : { text };
  }
}

/** The bytes read in `charset`, or undefined for none or one the platform does not know (TextDecoder's RangeError). */
function decodeAs(bytes: Uint8Array, charset: string | undefined): string | undefined {
  if (charset === undefined) return undefined;
  try {
    return new TextDecoder(charset).decode(bytes);
  } catch {
    return undefined;
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
