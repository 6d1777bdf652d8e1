import type { Dirent } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { join, relative, sep } from 'node:path';
import { findUp } from '../../core/package-files.js';
import { lazySchema } from '../../core/zod.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { type CorpusDocument, withoutCopies } from './copies.js';
import { DOCUMENT_KINDS, documentMarkdown, isDocument } from './document-markdown.js';
import { type CorpusSkip, type CorpusSkipReason, hasText, usableVector } from './document-text.js';
import { CorpusError } from './errors.js';
import type { Passage, PassageMetadata } from './passage.js';
import { VectorIndex } from './vector-index.js';
import { chunkMarkdown } from './markdown-chunks.js';
import { errorMessage } from '../../core/errors.js';
import { corpusIgnore, IGNORE_FILE } from './corpus-ignore.js';

/** The demo corpus shipped with the package: `data/corpus/` at the package root, from source or from `dist/`. */
export const BUNDLED_CORPUS = findUp(import.meta.url, 'data/corpus') ?? fileURLToPath(new URL('../../../data/corpus/', import.meta.url));

export { chunkMarkdown } from './markdown-chunks.js';

/** Files larger than this are not read (`too-large`): a document set has no 8 MiB page of prose. */
export const DEFAULT_MAX_FILE_BYTES = 8 * 2 ** 20;

/** Options of `loadCorpus`: the file size limit, documents to leave out and a report of skipped files. */
export interface LoadCorpusOptions {
  /** Files larger than this many bytes are skipped as `too-large`. Default 8 MiB. */
  readonly maxFileBytes?: number;
  /** Documents to leave out (`ignored`), in `.gitignore` syntax, beside those of the folder's `.sluiceignore`. */
  readonly ignore?: readonly string[];
  /** Told of every file and passage left out, and why; the rest of the corpus loads. */
  readonly onSkip?: (skip: CorpusSkip) => void;
}

const onSkipSchema = () => functionSchema<(skip: CorpusSkip) => void>();
const loadCorpusSchema = lazySchema((z) =>
  z.strictObject({
    maxFileBytes: positiveInt('maxFileBytes').optional(),
    ignore: z.array(z.string({ error: 'ignore must be a list of patterns' }), { error: 'ignore must be a list of patterns' }).optional(),
    onSkip: onSkipSchema().optional(),
  }),
);

/**
 * Reads every Markdown, text, HTML, reStructuredText, AsciiDoc and PDF file under `directory` (default:
 * the bundled demo corpus), gzip-compressed ones (`guide.rst.gz`) too, subfolders included, in path order, as passages cited by their path relative to it.
 * Plain text is split like Markdown without headings: one passage per paragraph; an HTML page's
 * main content (`htmlToMarkdown`), a reStructuredText page (`rstToMarkdown`), an AsciiDoc one
 * (`adocToMarkdown`) and a PDF's text (`pdfToMarkdown`) are read as the Markdown they translate to
 * (`documentMarkdown`). Hidden
 * folders and `node_modules` are skipped, and so are documents matching a pattern of the
 * folder's `.sluiceignore` or of `ignore` (`.gitignore` syntax: `internals/`, `drafts/*.md`).
 *
 * A file that is ignored, not text (binary, in no charset), too large or unreadable, and a passage
 * with no word in it (a `---` rule, an HTML comment), is left out and reported to `onSkip`. A
 * folder that is missing, holds no document, or nothing with a word in it fails with `CorpusError`.
 */
export async function loadCorpus(directory: string = BUNDLED_CORPUS, options: LoadCorpusOptions = {}): Promise<Passage[]> {
  parseOptions(loadCorpusSchema(), options, 'corpus options');
  const maxFileBytes = options.maxFileBytes ?? DEFAULT_MAX_FILE_BYTES;
  const skip = (reason: CorpusSkipReason, file: string, detail?: string, id?: string): void =>
    options.onSkip?.({ reason, file, ...(id !== undefined && { id }), ...(detail !== undefined && { detail }) });
  const files = await documentsIn(directory, { ignore: options.ignore ?? [], onIgnored: (file) => skip('ignored', file, `matches ${IGNORE_FILE} or ignore`) });
  const documents: CorpusDocument[] = [];
  let read = 0;
  for (const file of files) {
    const path = join(directory, file);
    let bytes: Buffer;
    try {
      // Checked before reading, so a huge file is never held in memory; and after, in case it grew.
      if ((await stat(path)).size > maxFileBytes) {
        skip('too-large', file, `more than ${maxFileBytes} bytes`);
        continue;
      }
      bytes = await readFile(path);
    } catch (err) {
      skip('unreadable', file, errorMessage(err));
      continue;
    }
    if (bytes.length > maxFileBytes) {
      skip('too-large', file, `more than ${maxFileBytes} bytes`);
      continue;
    }
    const document = await documentMarkdown(file, bytes, maxFileBytes);
    if ('skip' in document) {
      skip(document.skip, file, document.detail);
      continue;
    }
    read++;
    const chunks = chunkMarkdown(document.text, file);
    // An empty file (or one of headings and rules only) is counted too: it was read, and gave nothing.
    if (chunks.length === 0) skip('no-text', file, 'no paragraph in it');
    documents.push({ file, passages: chunks.filter((passage) => hasText(passage.text) || (skip('no-text', file, undefined, passage.id), false)) });
  }
  const kept = withoutCopies(documents, (copy) =>
    skip('duplicate', copy.file, copy.id === undefined ? `the same as ${copy.original}` : `also in ${copy.original}`, copy.id),
  );
  const passages = kept.flatMap((document) => document.passages);
  if (passages.length === 0)
    throw new CorpusError(
      directory,
      'nothing-indexable',
      read === 0
        ? `none of its ${files.length} documents is readable text`
        : `no paragraph with a word in it (${read} document${read === 1 ? '' : 's'} read: empty, or only markup)`,
    );
  return passages;
}

/** Which documents `documentsIn` leaves out: patterns beside the folder's `.sluiceignore`, and a report of each. */
export interface DocumentsInOptions {
  readonly ignore?: readonly string[];
  readonly onIgnored?: (file: string) => void;
}

/**
 * The documents under `directory`, relative to it, sorted, without those its `.sluiceignore` or
 * `ignore` leaves out; a `CorpusError` for a folder that cannot be listed or holds none.
 */
export async function documentsIn(directory: string, options: DocumentsInOptions = {}): Promise<string[]> {
  let entries: Dirent[];
  try {
    entries = await readdir(directory, { recursive: true, withFileTypes: true });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new CorpusError(directory, 'missing', 'no such directory', err);
    if (code === 'ENOTDIR') throw new CorpusError(directory, 'not-a-directory', 'not a directory', err);
    throw new CorpusError(directory, 'unreadable', `cannot be read (${code ?? errorMessage(err)})`, err);
  }
  const files = entries
    .filter((e) => e.isFile() && isDocument(e.name))
    .map((e) =>
      relative(directory, join(e.parentPath ?? e.path, e.name))
        .split(sep)
        .join('/'),
    )
    .filter((file) => !file.split('/').some((part) => part.startsWith('.') || part === 'node_modules'))
    .sort();
  const ignored = await corpusIgnore(directory, options.ignore);
  const kept = ignored === undefined ? files : files.filter((file) => !ignored(file) || (options.onIgnored?.(file), false));
  if (kept.length === 0)
    throw new CorpusError(
      directory,
      'no-documents',
      files.length === 0 ? `no ${DOCUMENT_KINDS} in it` : `all of its ${files.length} documents are ignored (${IGNORE_FILE} or the ignore patterns)`,
    );
  return kept;
}

/** Options of `indexPassages`: the batch size, the abort signal and a report of skipped passages. */
export interface IndexPassagesOptions {
  /** Passages embedded per call. Default 32. */
  readonly batchSize?: number;
  readonly signal?: AbortSignal;
  /** Told of every passage left out (no word in it, or no usable vector), and why; the rest is indexed. */
  readonly onSkip?: (skip: CorpusSkip) => void;
  /** What the passages are, in a `CorpusError` (e.g. the corpus folder). Default `passages`. */
  readonly corpus?: string;
}

const indexPassagesSchema = lazySchema((z) =>
  z.strictObject({
    batchSize: positiveInt('batchSize').optional(),
    signal: z.instanceof(AbortSignal, { error: 'signal must be an AbortSignal' }).optional(),
    onSkip: onSkipSchema().optional(),
    corpus: z.string({ error: 'corpus must be a string' }).optional(),
  }),
);

/**
 * Embeds `passages` in batches and indexes them with their text and source, ready
 * for `retrieve`. A passage with no word in it, or whose vector is unusable (all zeros,
 * not finite, another size than the first), or on which the embedder fails alone, is left
 * out and reported to `onSkip`. When none is left: `CorpusError` (`nothing-indexable`).
 */
export async function indexPassages(
  passages: readonly Passage[],
  embedder: (texts: string[], signal: AbortSignal) => Promise<Float32Array[]>,
  options: IndexPassagesOptions = {},
): Promise<VectorIndex<PassageMetadata>> {
  parseOptions(indexPassagesSchema(), options, 'indexPassages options');
  const batchSize = options.batchSize ?? 32;
  const signal = options.signal ?? new AbortController().signal;
  const skip = (reason: CorpusSkipReason, passage: Passage, detail?: string): void =>
    options.onSkip?.({ reason, file: passage.source, id: passage.id, ...(detail !== undefined && { detail }) });
  let index: VectorIndex<PassageMetadata> | undefined;
  let firstError: unknown;
  const embedAlone = async (passage: Passage): Promise<Float32Array | undefined> => {
    try {
      const [vector] = await embedder([passage.text], signal);
      if (vector === undefined) skip('not-embeddable', passage, 'the embedder returned no vector');
      return vector;
    } catch (err) {
      signal.throwIfAborted();
      firstError ??= err;
      skip('not-embeddable', passage, errorMessage(err));
      return undefined;
    }
  };
  const embeddable = passages.filter((passage) => hasText(passage.text) || (skip('no-text', passage), false));
  for (let start = 0; start < embeddable.length; start += batchSize) {
    const batch = embeddable.slice(start, start + batchSize);
    let vectors: (Float32Array | undefined)[] | undefined;
    try {
      vectors = await embedder(
        batch.map((p) => p.text),
        signal,
      );
    } catch {
      signal.throwIfAborted();
    }
    if (vectors === undefined) {
      // One passage may fail a whole batch: each alone, so only the ones it cannot embed are left out.
      vectors = [];
      for (const passage of batch) vectors.push(await embedAlone(passage));
    } else if (vectors.length !== batch.length) throw new RangeError(`the embedder returned ${vectors.length} vectors for ${batch.length} passages`);
    batch.forEach((passage, i) => {
      const vector = vectors[i];
      if (vector === undefined) return; // reported by embedAlone
      if (!usableVector(vector, index?.dim)) return skip('not-embeddable', passage, 'its vector is all zeros, not finite, or of another size');
      index ??= new VectorIndex<PassageMetadata>(vector.length, { capacity: embeddable.length });
      index.add(passage.id, vector, { text: passage.text, source: passage.source, ...(passage.headings !== undefined && { headings: passage.headings }) });
    });
  }
  if (index === undefined)
    throw new CorpusError(
      options.corpus ?? 'passages',
      'nothing-indexable',
      passages.length === 0 ? 'no passage to index' : `none of its ${passages.length} passages could be embedded`,
      firstError,
    );
  return index;
}
