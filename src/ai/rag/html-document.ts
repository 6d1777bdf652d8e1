/**
 * An HTML page as the Markdown the corpus's chunker reads: its main content only (the `<main>`,
 * the element whose role is main, or the one `<article>`; else the body without its navigation,
 * header, footer and asides), without scripts, styles, forms and link targets, then translated by
 * node-html-markdown, so that headings, code blocks, lists and tables are chunked as they are in a
 * Markdown page.
 */
import type { HTMLElement } from 'node-html-parser';

/** What no reader of the page's content reads: page furniture and controls. */
const FURNITURE = 'script, style, noscript, template, svg, canvas, iframe, object, form, button, input, select, textarea, img, picture, video, audio';
/** Around the content when no element says which is the main one. */
const CHROME = 'nav, [role=navigation], header, footer, aside, [role=banner], [role=contentinfo], [role=complementary]';

type Parse = (html: string) => HTMLElement;
type Translate = (html: string) => string;
let libraries: Promise<{ readonly parse: Parse; readonly translate: Translate }> | undefined;

/** The two libraries, loaded at the first HTML page: a corpus of Markdown never reads them. */
function load(): Promise<{ readonly parse: Parse; readonly translate: Translate }> {
  libraries ??= Promise.all([import('node-html-parser'), import('node-html-markdown')]).then(([parser, markdown]) => {
    // The Markdown is read by the chunker, never rendered: a backslash before `_` or `*` would only be quoted.
    const translator = new markdown.NodeHtmlMarkdown({ maxConsecutiveNewlines: 2, globalEscape: [/(?!)/g, ''] });
    return {
      parse: (html: string) => parser.parse(html, { comment: false, blockTextElements: { script: true, noscript: true, style: true } }),
      translate: (html: string) => translator.translate(html),
    };
  });
  return libraries;
}

/** Whether a document's file name says it is HTML. */
export function isHtmlFile(file: string): boolean {
  return /\.html?$/i.test(file);
}

/** The main content of the HTML page `html` as Markdown; its `<title>` heads it when the content has no `<h1>`. */
export async function htmlToMarkdown(html: string): Promise<string> {
  const { parse, translate } = await load();
  const page = parse(html);
  const title = page.querySelector('title')?.text.trim() ?? '';
  const articles = page.querySelectorAll('article');
  const chosen = page.querySelector('main') ?? page.querySelector('[role=main]') ?? (articles.length === 1 ? articles[0] : undefined);
  const content = chosen ?? page.querySelector('body') ?? page;
  if (chosen === undefined) for (const element of content.querySelectorAll(CHROME)) element.remove();
  for (const element of content.querySelectorAll(FURNITURE)) element.remove();
  for (const element of content.querySelectorAll('[aria-hidden=true]')) element.remove();
  for (const link of content.querySelectorAll('a')) {
    // A permalink's "#" or "¶" says nothing; a link's target is an address, not what the page says: its text stays.
    if (!/[\p{L}\p{N}]/u.test(link.text)) link.remove();
    else link.removeAttribute('href');
  }
  // The translator drops a line break after inline code, joining two words: prose lines join with a space.
  spaceLineBreaks(content);
  // A block of code as its text alone: highlighting spans dropped, variants (ESM and CommonJS) a blank line apart.
  for (const block of content.querySelectorAll('pre')) {
    const variants = block.querySelectorAll('code');
    const code = variants.length > 1 ? variants.map((variant) => variant.text).join('\n\n') : block.text;
    block.set_content(`<code>${escapeHtml(code)}</code>`);
  }
  const markdown = translateInPieces(content, translate).trim();
  return title !== '' && content.querySelector('h1') === null ? `# ${title}\n\n${markdown}` : markdown;
}

/** `text` as HTML text: the three characters markup reads. */
function escapeHtml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/** Line breaks in the text of `element` as spaces, outside `<pre>`, where they are the code's own. */
function spaceLineBreaks(element: HTMLElement): void {
  for (const child of element.childNodes) {
    if (child.nodeType === TEXT_NODE) {
      const text = child as unknown as { rawText: string };
      if (text.rawText.includes('\n')) text.rawText = text.rawText.replace(/[ \t]*\r?\n[ \t]*/g, ' ');
    } else if (child.nodeType === ELEMENT_NODE && (child as HTMLElement).tagName !== 'PRE') spaceLineBreaks(child as HTMLElement);
  }
}

/** node-html-parser's node types (the DOM's numbers). */
const ELEMENT_NODE = 1;
const TEXT_NODE = 3;

/** HTML translated this many characters at a time at most: the translator's time grows faster than its input (20,000 sections of a 3.5 MB page: 90 s whole, under 1 s in pieces). */
const TRANSLATE_CHARS = 32_768;
/** Elements that only group blocks: a large one is translated child by child, its Markdown the same. */
const GROUPS = new Set(['DIV', 'SECTION', 'ARTICLE', 'MAIN', 'BODY', 'CENTER']);
/** Elements Markdown writes apart from their neighbours: a piece may end before one. */
const BLOCKS = new Set([
  ...GROUPS,
  'P',
  'H1',
  'H2',
  'H3',
  'H4',
  'H5',
  'H6',
  'UL',
  'OL',
  'DL',
  'TABLE',
  'PRE',
  'BLOCKQUOTE',
  'HR',
  'DETAILS',
  'FIGURE',
  'HEADER',
  'FOOTER',
  'ASIDE',
  'NAV',
]);

/** `content`'s Markdown, translated in pieces of whole blocks of at most about `TRANSLATE_CHARS`. */
function translateInPieces(content: HTMLElement, translate: Translate): string {
  const parts: { readonly html: string; readonly block: boolean }[] = [];
  collect(content, parts);
  const out: string[] = [];
  let batch = '';
  let endsBlock = true;
  for (const part of parts) {
    // Inline neighbours (text, a code span) stay in one piece: cut only between blocks.
    if (batch !== '' && batch.length + part.html.length > TRANSLATE_CHARS && endsBlock && part.block) {
      out.push(translate(batch));
      batch = '';
    }
    batch += part.html;
    endsBlock = part.block;
  }
  if (batch !== '') out.push(translate(batch));
  return out.join('\n\n');
}

/** The children of `element` as HTML, a large grouping element's own children in its place. */
function collect(element: HTMLElement, parts: { html: string; block: boolean }[]): void {
  for (const child of element.childNodes) {
    const tag = child.nodeType === ELEMENT_NODE ? (child as HTMLElement).tagName : '';
    const html = child.toString();
    if (GROUPS.has(tag) && html.length > TRANSLATE_CHARS) collect(child as HTMLElement, parts);
    else parts.push({ html, block: BLOCKS.has(tag) });
  }
}
