import { readdir, readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { join, relative, sep } from 'node:path';
import { findUp } from '../../core/package-files.js';
import type { Passage, PassageMetadata } from './passage.js';
import { VectorIndex } from './vector-index.js';

/** The demo corpus shipped with the package: `data/corpus/` at the package root, from source or from `dist/`. */
export const BUNDLED_CORPUS = findUp(import.meta.url, 'data/corpus') ?? fileURLToPath(new URL('../../../data/corpus/', import.meta.url));

const HEADING = /^(#{1,6})\s+(.+?)\s*#*\s*$/;
const FENCE = /^\s*(```|~~~)/;

function slug(text: string): string {
  return (
    text
      .toLowerCase()
      .replace(/[^\p{L}\p{N}]+/gu, '-')
      .replace(/^-+|-+$/g, '') || 'section'
  );
}

/**
 * Splits markdown into passages: one per paragraph (a list or a fenced code block
 * counts as one), each cited by its file and nearest heading. Headings themselves
 * are not passages. Ids are `file#heading-slug-n`, stable while the document's
 * structure is.
 */
export function chunkMarkdown(markdown: string, file: string): Passage[] {
  const passages: Passage[] = [];
  let heading = '';
  let paragraph: string[] = [];
  let inFence = false;
  const perHeading = new Map<string, number>();
  const flush = (): void => {
    const text = paragraph.join('\n').trim();
    paragraph = [];
    if (text.length === 0) return;
    const key = slug(heading || file);
    const n = (perHeading.get(key) ?? 0) + 1;
    perHeading.set(key, n);
    passages.push({ id: `${file}#${key}-${n}`, text, source: heading ? `${file} › ${heading}` : file });
  };
  for (const line of markdown.split(/\r?\n/)) {
    if (FENCE.test(line)) inFence = !inFence;
    // A blank line or a heading inside a fenced block is code, not structure.
    const heading_ = inFence ? null : HEADING.exec(line);
    if (heading_) {
      flush();
      heading = heading_[2]!;
    } else if (!inFence && line.trim() === '') {
      flush();
    } else {
      paragraph.push(line);
    }
  }
  flush();
  return passages;
}

/** What `loadCorpus` reads: Markdown and plain text. */
const DOCUMENT = /\.(md|markdown|mdx|txt|text)$/i;

/**
 * Reads every Markdown and text file under `directory` (default: the bundled demo corpus),
 * subfolders included, in path order, as passages cited by their path relative to it.
 * Plain text is split like Markdown without headings: one passage per paragraph. Hidden
 * folders and `node_modules` are skipped. A folder with no document fails, naming it.
 */
export async function loadCorpus(directory: string = BUNDLED_CORPUS): Promise<Passage[]> {
  const entries = await readdir(directory, { recursive: true, withFileTypes: true });
  const files = entries
    .filter((e) => e.isFile() && DOCUMENT.test(e.name))
    .map((e) =>
      relative(directory, join(e.parentPath ?? e.path, e.name))
        .split(sep)
        .join('/'),
    )
    .filter((file) => !file.split('/').some((part) => part.startsWith('.') || part === 'node_modules'))
    .sort();
  if (files.length === 0) throw new Error(`corpus ${directory}: no Markdown or text file (.md, .markdown, .mdx, .txt) in it`);
  const passages: Passage[] = [];
  for (const file of files) passages.push(...chunkMarkdown(await readFile(join(directory, file), 'utf8'), file));
  return passages;
}

/**
 * Embeds `passages` in batches and indexes them with their text and source, ready
 * for `retrieve`.
 */
export async function indexPassages(
  passages: readonly Passage[],
  embedder: (texts: string[], signal: AbortSignal) => Promise<Float32Array[]>,
  options: { batchSize?: number; signal?: AbortSignal } = {},
): Promise<VectorIndex<PassageMetadata>> {
  const batchSize = options.batchSize ?? 32;
  const signal = options.signal ?? new AbortController().signal;
  let index: VectorIndex<PassageMetadata> | undefined;
  for (let start = 0; start < passages.length; start += batchSize) {
    const batch = passages.slice(start, start + batchSize);
    const vectors = await embedder(
      batch.map((p) => p.text),
      signal,
    );
    batch.forEach((passage, i) => {
      const vector = vectors[i];
      if (vector === undefined) throw new RangeError(`the embedder returned ${vectors.length} vectors for ${batch.length} passages`);
      index ??= new VectorIndex<PassageMetadata>(vector.length, { capacity: passages.length });
      index.add(passage.id, vector, { text: passage.text, source: passage.source });
    });
  }
  if (index === undefined) throw new RangeError('cannot index an empty corpus: the dimension comes from the first vector');
  return index;
}
