/**
 * A corpus document as the Markdown the chunker reads, by its format: Markdown and plain text as
 * they are (MyST's directives and roles read), HTML, reStructuredText, AsciiDoc and PDF translated, each also gzip-compressed (`guide.rst.gz`,
 * as Debian ships documentation). Which files are documents at all is decided here too.
 */
import { gunzipSync } from 'node:zlib';
import { adocToMarkdown, isAdocFile } from './adoc-document.js';
import { type CorpusSkipReason, decodeDocument } from './document-text.js';
import { errorMessage } from '../../core/errors.js';
import { htmlToMarkdown, isHtmlFile } from './html-document.js';
import { isMyst, mystToMarkdown } from './myst-document.js';
import { isPdfFile, pdfToMarkdown } from './pdf-document.js';
import { isRstFile, rstToMarkdown } from './rst-document.js';

/** What `loadCorpus` reads: Markdown, plain text, HTML, reStructuredText, AsciiDoc and PDF. */
const DOCUMENT = /\.(md|markdown|mdx|txt|text|html?|rst|rest|adoc|asciidoc|pdf)(\.gz)?$/i;

/** A compressed document: read as the one it holds. */
const GZIP = /\.gz$/i;

/** The formats read, as the error for a folder without any names them. */
export const DOCUMENT_KINDS =
  'Markdown, text, HTML, reStructuredText, AsciiDoc or PDF file (.md, .markdown, .mdx, .txt, .html, .rst, .adoc, .pdf, each also as .gz)';

/** Whether `file` is a document `loadCorpus` reads, by its name. */
export function isDocument(file: string): boolean {
  return DOCUMENT.test(file);
}

/**
 * The Markdown of the document `file` (its bytes), or why it is left out: not text, or a page its
 * translator cannot read, or a compressed one holding more than `maxBytes`.
 */
export async function documentMarkdown(
  file: string,
  bytes: Uint8Array,
  maxBytes: number = Number.MAX_SAFE_INTEGER,
): Promise<{ readonly text: string } | { readonly skip: CorpusSkipReason; readonly detail?: string }> {
  if (GZIP.test(file)) {
    let inner: Buffer;
    try {
      // Stopped at the size limit, so a small archive of a huge file (or a gzip bomb) is never held whole.
      inner = gunzipSync(bytes, { maxOutputLength: Math.min(maxBytes, 2 ** 31 - 1) });
    } catch (err) {
      const tooLarge = (err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE';
      return tooLarge ? { skip: 'too-large', detail: `more than ${maxBytes} bytes uncompressed` } : { skip: 'unreadable', detail: errorMessage(err) };
    }
    return documentMarkdown(file.replace(GZIP, ''), inner, maxBytes);
  }
  try {
    // A PDF is binary: its text is in its content streams, not its bytes.
    if (isPdfFile(file)) return { text: await pdfToMarkdown(bytes) };
    const decoded = decodeDocument(bytes, isHtmlFile(file));
    if ('skip' in decoded) return decoded;
    if (isHtmlFile(file)) return { text: await htmlToMarkdown(decoded.text) };
    if (isRstFile(file)) return { text: rstToMarkdown(decoded.text) };
    if (isAdocFile(file)) return { text: adocToMarkdown(decoded.text) };
    // Sphinx's Markdown (MyST) carries directives and roles CommonMark would read as code and text.
    if (/\.(md|markdown|mdx)$/i.test(file) && isMyst(decoded.text)) return { text: mystToMarkdown(decoded.text) };
    return decoded;
  } catch (err) {
    return { skip: 'unreadable', detail: errorMessage(err) };
  }
}
