/**
 * A PDF document as the Markdown the corpus's chunker reads. A PDF holds positioned text, not
 * paragraphs: its text runs (read by unpdf, a packaging of Mozilla's pdf.js) are joined into lines
 * by baseline, lines into paragraphs where the gap between them outgrows the line spacing, and a
 * line set larger than the body text becomes a heading. A line on most pages (a running header or
 * footer) and a lone page number are left out.
 */

/** A run of text as pdf.js gives it: its string, its transform (`[scaleX, skewY, skewX, scaleY, x, y]`) and width. */
interface TextRun {
  readonly str: string;
  readonly transform: readonly number[];
  readonly width: number;
}

/** A line of a page: its text, its baseline, its type size. */
interface Line {
  text: string;
  readonly y: number;
  readonly size: number;
  end: number;
}

/** What unpdf is used for: a document's pages and each page's text runs. */
interface PdfDocument {
  readonly numPages: number;
  getPage(n: number): Promise<{ getTextContent(): Promise<{ readonly items: readonly unknown[] }> }>;
  destroy(): Promise<void>;
}

type Open = (bytes: Uint8Array) => Promise<PdfDocument>;
let opener: Promise<Open> | undefined;

/** unpdf, loaded at the first PDF of a corpus: a corpus without one never reads it. */
function open(): Promise<Open> {
  // pdf.js's warnings about a damaged file would land on the server's stdout; the skip says what failed.
  opener ??= import('unpdf').then((unpdf) => (bytes: Uint8Array) => unpdf.getDocumentProxy(bytes, { verbosity: 0 }) as unknown as Promise<PdfDocument>);
  return opener;
}

/** Whether a document's file name says it is a PDF. */
export function isPdfFile(file: string): boolean {
  return /\.pdf$/i.test(file);
}

/** A gap between baselines this many times the type size or more ends a paragraph (text is set at about 1.2). */
const PARAGRAPH_GAP = 1.6;
/** A line set this much larger than the body text is a heading. */
const HEADING_SIZE = 1.15;
/** A heading is a short line: a longer one set large is a pull quote or a title page's prose. */
const HEADING_CHARS = 120;

const isRun = (item: unknown): item is TextRun =>
  typeof item === 'object' && item !== null && typeof (item as TextRun).str === 'string' && Array.isArray((item as TextRun).transform);

/** The page's runs as lines, top to bottom as pdf.js gives them, a space where runs stand apart. */
function linesOf(runs: readonly TextRun[]): Line[] {
  const lines: Line[] = [];
  for (const run of runs) {
    const size = Math.abs(run.transform[3] ?? 0) || Math.abs(run.transform[0] ?? 0);
    const x = run.transform[4] ?? 0;
    const y = run.transform[5] ?? 0;
    if (run.str === '') continue;
    const last = lines.at(-1);
    if (last !== undefined && Math.abs(last.y - y) <= 0.5 * Math.max(size, last.size)) {
      const apart = x - last.end > 0.15 * size && !/\s$/.test(last.text) && !/^\s/.test(run.str);
      last.text += `${apart ? ' ' : ''}${run.str}`;
      last.end = x + run.width;
    } else lines.push({ text: run.str, y, size, end: x + run.width });
  }
  return lines.filter((line) => line.text.trim() !== '');
}

/** The size most of the document's characters are set in. */
function bodySize(pages: readonly Line[][]): number {
  const chars = new Map<number, number>();
  for (const line of pages.flat()) {
    const size = Math.round(line.size * 2) / 2;
    chars.set(size, (chars.get(size) ?? 0) + line.text.length);
  }
  return [...chars.entries()].sort((a, b) => b[1] - a[1])[0]?.[0] ?? 0;
}

/** A line that Markdown would read as markup (a `# comment` of a listing as a heading, a ```` ``` ```` as a fence, `---` as a rule): its first mark escaped. */
const MARKUP_LINE = /^(\s{0,3})(#{1,6}(?=\s|$)|`{3,}|~{3,}|[-=*_](?:\s*[-=*_]){2,}\s*$)/;
const literal = (text: string): string => text.replace(MARKUP_LINE, '$1\\$2');

/** A line as running headers are compared: its numbers (the page's) as one mark, its spaces as one. */
const runningKey = (text: string): string => text.replace(/\d+/g, '#').replace(/\s+/g, ' ').trim();

/** Lines found on most pages (running headers and footers, numbers aside), as a key of their letters. */
function runningLines(pages: readonly Line[][]): Set<string> {
  const seen = new Map<string, number>();
  for (const page of pages) for (const text of new Set(page.map((line) => runningKey(line.text)))) seen.set(text, (seen.get(text) ?? 0) + 1);
  const running = new Set<string>();
  if (pages.length >= 3) for (const [text, count] of seen) if (count >= pages.length / 2) running.add(text);
  return running;
}

/** The Markdown of the PDF `bytes`: headings by type size, paragraphs by spacing. Throws when pdf.js cannot read it (encrypted, damaged). */
export async function pdfToMarkdown(bytes: Uint8Array): Promise<string> {
  // pdf.js takes the buffer over: a copy leaves the caller's bytes as they were.
  const document = await (await open())(new Uint8Array(bytes));
  try {
    const pages: Line[][] = [];
    for (let n = 1; n <= document.numPages; n++) {
      const content = await (await document.getPage(n)).getTextContent();
      pages.push(linesOf(content.items.filter(isRun)));
    }
    const body = bodySize(pages);
    const running = runningLines(pages);
    const headingSizes = [
      ...new Set(
        pages
          .flat()
          .filter((l) => l.size >= HEADING_SIZE * body)
          .map((l) => Math.round(l.size)),
      ),
    ].sort((a, b) => b - a);
    const out: string[] = [];
    for (const page of pages) {
      let previous: Line | undefined;
      for (const line of page) {
        const text = line.text.replace(/\s+/g, ' ').trim();
        if (/^\d+$/.test(text) || running.has(runningKey(text))) continue;
        const level = headingSizes.indexOf(Math.round(line.size));
        if (level >= 0 && text.length <= HEADING_CHARS && !/[.,;]$/.test(text)) {
          out.push('', `${'#'.repeat(Math.min(3, level + 1))} ${text}`, '');
          previous = undefined;
          continue;
        }
        const gap = previous === undefined ? 0 : Math.abs(previous.y - line.y);
        if (previous === undefined || gap >= PARAGRAPH_GAP * line.size || Math.abs(previous.size - line.size) > 0.5) out.push('');
        // A word broken over two lines (`produc-` / `er`) is one word again.
        const last = out.at(-1);
        if (last !== undefined && last !== '' && /\p{Ll}-$/u.test(last) && /^\p{Ll}/u.test(text)) out[out.length - 1] = `${last.slice(0, -1)}${text}`;
        else out.push(literal(text));
        previous = line;
      }
      out.push('');
    }
    return `${out
      .join('\n')
      .replace(/\n{3,}/g, '\n\n')
      .trim()}\n`;
  } finally {
    await document.destroy();
  }
}
