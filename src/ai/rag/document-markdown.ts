/**
 * A corpus document as the Markdown the chunker reads, by its format: Markdown and plain text as
 * they are, HTML, reStructuredText, AsciiDoc and PDF translated. Which files are documents at all
 * is decided here too.
 */
import { adocToMarkdown, isAdocFile } from './adoc-document.js';
import { type CorpusSkipReason, decodeDocument } from './document-text.js';
import { errorMessage } from '../../core/errors.js';
import { htmlToMarkdown, isHtmlFile } from './html-document.js';
import { isPdfFile, pdfToMarkdown } from './pdf-document.js';
import { isRstFile, rstToMarkdown } from './rst-document.js';

/** What `loadCorpus` reads: Markdown, plain text, HTML, reStructuredText, AsciiDoc and PDF. */
const DOCUMENT = /\.(md|markdown|mdx|txt|text|html?|rst|rest|adoc|asciidoc|pdf)$/i;

/** The formats read, as the error for a folder without any names them. */
export const DOCUMENT_KINDS = 'Markdown, text, HTML, reStructuredText, AsciiDoc or PDF file (.md, .markdown, .mdx, .txt, .html, .rst, .adoc, .pdf)';

/** Whether `file` is a document `loadCorpus` reads, by its name. */
export function isDocument(file: string): boolean {
  return DOCUMENT.test(file);
}

/** The Markdown of the document `file` (its bytes), or why it is left out: not text, or a page its translator cannot read. */
export async function documentMarkdown(
  file: string,
  bytes: Uint8Array,
): Promise<{ readonly text: string } | { readonly skip: CorpusSkipReason; readonly detail?: string }> {
  try {
    // A PDF is binary: its text is in its content streams, not its bytes.
    if (isPdfFile(file)) return { text: await pdfToMarkdown(bytes) };
    const decoded = decodeDocument(bytes, isHtmlFile(file));
    if ('skip' in decoded) return decoded;
    if (isHtmlFile(file)) return { text: await htmlToMarkdown(decoded.text) };
    if (isRstFile(file)) return { text: rstToMarkdown(decoded.text) };
    if (isAdocFile(file)) return { text: adocToMarkdown(decoded.text) };
    return decoded;
  } catch (err) {
    return { skip: 'unreadable', detail: errorMessage(err) };
  }
}
