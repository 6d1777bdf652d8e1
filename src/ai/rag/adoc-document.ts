/**
 * An AsciiDoc page (`.adoc`, as Asciidoctor and Antora sites write them) as the Markdown the
 * corpus's chunker reads: section titles as headings, listing and literal blocks as fences (in the
 * language their `[source,lang]` names), tables as Markdown rows, lists as Markdown lists, links and
 * cross references as their text. Asciidoctor.js would render HTML for `htmlToMarkdown`, but weighs
 * tens of megabytes for what is a line-by-line reading of the parts that carry a page's structure.
 */
import { fenced } from './code-fence.js';

/** A section title: `=` to `======` (or Markdown's `#`), a space, the title. */
const TITLE = /^(={1,6}|#{1,6})\s+(\S.*?)\s*=*\s*$/;
/** A block's delimiter line: listing `----`, literal `....`, example `====`, sidebar `****`, quote `____`, comment `////`, open `--`, table `|===`. */
const DELIMITER = /^(-{4,}|\.{4,}|={4,}|\*{4,}|_{4,}|\/{4,}|--|[|,:!]={3,})\s*$/;
/** A block attribute line (`[source,js]`, `[NOTE]`, `[[anchor]]`, `[#id.role]`): what the next block is, not text. */
const ATTRIBUTES = /^\[(?:\[[^\]]*\]|[^\]]*)\]\s*$/;

/** Where a block title stands right before its block: the blank line a block opens with is not written there. */
const LEAD = '\u0000lead';

/** Whether a document's file name says it is AsciiDoc. */
export function isAdocFile(file: string): boolean {
  return /\.(adoc|asciidoc)$/i.test(file);
}

/** Inline markup as its text: `link:url[text]`, `https://x[text]`, `xref:a.adoc[text]`, `<<id,text>>`, `kbd:[Ctrl+C]`, `+passthrough+`. */
function inline(line: string): string {
  return line
    .replace(/`\+([^`]+)\+`/g, '`$1`')
    .replace(/\b(?:link|xref|mailto):([^\s[]*)\[([^\]]*)\]/g, (_, target: string, text: string) => text || target)
    .replace(/\b(https?:\/\/[^\s[]+)\[([^\]]*)\]/g, (_, url: string, text: string) => text || url)
    .replace(/<<([^,>]+)(?:,\s*([^>]+))?>>/g, (_, id: string, text: string | undefined) => text ?? id)
    .replace(/\b(?:kbd|btn|menu):\[([^\]]*)\]/g, '$1')
    .replace(/(^|[\s(])\+([^+\s](?:[^+]*[^+\s])?)\+(?=$|[\s),.;:!?])/g, '$1`$2`');
}

/** A table's cells (`|a |b`, one or more a line) as Markdown rows of as many cells as its first line holds. */
function tableRows(lines: readonly string[]): string[] {
  const cells = (line: string): string[] =>
    line
      .split('|')
      .slice(1)
      .map((cell) => inline(cell.trim()).replace(/\|/g, '\\|'));
  const first = lines.find((l) => l.trim().startsWith('|'));
  if (first === undefined) return [];
  const width = Math.max(1, cells(first.trim()).length);
  const all = lines.filter((l) => l.trim().startsWith('|')).flatMap((l) => cells(l.trim()));
  const rows: string[] = [];
  for (let at = 0; at < all.length; at += width) rows.push(`| ${all.slice(at, at + width).join(' | ')} |`);
  if (rows.length > 0) rows.splice(1, 0, `|${' --- |'.repeat(width)}`);
  return rows;
}

/** The Markdown of AsciiDoc `text`. */
export function adocToMarkdown(text: string): string {
  const out: string[] = [];
  let language = '';
  // A block read apart (an example's or a sidebar's paragraphs) is read as the page's own lines, where it stands.
  const read = (lines: readonly string[], start: number): void => {
    let i = start;
    while (i < lines.length) {
      const line = lines[i]!;
      const trimmed = line.trim();
      const delimiter = DELIMITER.exec(trimmed)?.[1];
      if (delimiter !== undefined) {
        let end = i + 1;
        while (end < lines.length && lines[end]!.trim() !== trimmed) end++;
        const body = lines.slice(i + 1, end);
        const kind = delimiter[0]!;
        if (kind === '-' && delimiter !== '--') out.push(...fenced(body, language));
        else if (kind === '.') out.push(...fenced(body));
        else if (kind === '|' || kind === ',' || kind === ':' || kind === '!') out.push('', ...tableRows(body), '');
        else if (kind !== '/') {
          // Example, sidebar, quote and open blocks hold the page's own paragraphs.
          out.push('');
          read(body, 0);
          out.push('');
        }
        language = '';
        i = end + 1;
        continue;
      }
      const title = TITLE.exec(line);
      if (title !== null) {
        out.push('', `${'#'.repeat(Math.min(6, title[1]!.length))} ${inline(title[2]!)}`, '');
        i++;
        continue;
      }
      if (ATTRIBUTES.test(trimmed)) {
        language = /^\[(?:source|listing)\s*,\s*([\w+#-]+)/.exec(trimmed)?.[1] ?? '';
        i++;
        continue;
      }
      // Line comments, and an attribute entry set mid-page.
      if (/^\/\/(?!\/)/.test(line) || /^:[\w-]+!?:/.test(line)) {
        i++;
        continue;
      }
      // A block title (`.Configuration options`) introduces what follows, as a lead-in ending in `:` does in Markdown.
      if (/^\.[^.\s]/.test(line)) {
        out.push('', `${inline(line.slice(1).trim()).replace(/[.:]$/, '')}:`, LEAD);
        i++;
        continue;
      }
      // A list continuation (`+` alone) joins the next block to the item.
      if (trimmed === '+') {
        out.push('');
        i++;
        continue;
      }
      const item = /^(\*{1,5}|-|\.{1,5})\s+(.*)$/.exec(line);
      if (item !== null) {
        const depth = item[1] === '-' ? 0 : item[1]!.length - 1;
        out.push(`${'  '.repeat(depth)}${item[1]![0] === '.' ? '1.' : '-'} ${inline(item[2]!)}`);
        i++;
        continue;
      }
      // A description list item (`term:: definition`) as the term and its definition.
      const term = /^(\S.*?)(:{2,4}|;;)(?:\s+(.*))?$/.exec(line);
      if (term !== null && !/^[a-z][\w+.-]*:\/\//i.test(line)) {
        out.push(`${inline(term[1]!)}: ${inline(term[3] ?? '')}`.trimEnd());
        i++;
        continue;
      }
      out.push(inline(line));
      i++;
    }
  };
  const lines = text.replace(/\r\n?/g, '\n').split('\n');
  let start = 0;
  // The header's attribute entries (`:toc:`, `:source-highlighter: rouge`) configure, they say nothing.
  while (start < lines.length && (/^:[\w-]+!?:/.test(lines[start]!) || lines[start]!.trim() === '')) start++;
  read(lines, start);
  return `${out
    .join('\n')
    .replace(new RegExp(`\\n${LEAD}\\n+`, 'g'), '\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim()}\n`;
}
