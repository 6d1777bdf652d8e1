/**
 * Markdown (and plain text) cut into passages that know where they stand: each paragraph, list,
 * code fence or table is one passage carrying the path of headings above it. Front matter gives the
 * document its title and is never a passage; a horizontal rule only separates.
 */
import type { Passage } from './passage.js';

const HEADING = /^ {0,3}(#{1,6})\s+(.+?)\s*#*\s*$/;
const FENCE = /^ {0,3}(`{3,}|~{3,})/;
/** A line opening an HTML comment block. */
const COMMENT_OPEN = /^ {0,3}<!--/;
/** A thematic break: three or more `-`, `*` or `_`, spaces allowed between. */
const RULE = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const SETEXT = /^ {0,3}(=+|-+)\s*$/;
const TABLE_ROW = /^\s*\|.*\|\s*$/;
const LIST_ITEM = /^\s*([-*+]|\d+[.)])\s+/;
/**
 * A paragraph that only names what follows, as a heading would: one code span without spaces
 * (`http.client.request.start`), or bold words not ending a sentence (`**Example**`, `**Params**`).
 */
const LABEL = /^(?:`[^`\s]+`|\*\*[^*\n]*[^*\n.!?:;,]\*\*)$/;

/** Table rows per passage at most: a long table is cut, each piece keeping its header. */
const TABLE_ROWS = 12;
/** Characters of list items gathered in one passage at most (one long item may exceed it alone). */
const LIST_CHARS = 600;

function slug(text: string): string {
  return (
    text
      .toLowerCase()
      .replace(/[^\p{L}\p{N}]+/gu, '-')
      .replace(/^-+|-+$/g, '') || 'section'
  );
}

/** A heading's text without inline markup: what a reader sees. Images (badges, logos) and HTML tags are left out, links keep their text. */
function plain(heading: string): string {
  return (
    heading
      .split(/(`[^`]*`)/)
      // Markup outside code spans: a code span is read as it is written (`$<TARGET_FILE:tgt>` is no HTML tag).
      .map((part) => (part.startsWith('`') && part.endsWith('`') && part.length > 1 ? part.slice(1, -1) : outsideCode(part)))
      .join('')
      .trim()
  );
}

/** Inline markup of a heading's text outside code spans: images and tags left out, links as their text, emphasis marks dropped. */
function outsideCode(text: string): string {
  return (
    text
      .replace(/!\[[^\]]*\](\([^)]*\)|\[[^\]]*\])/g, '')
      .replace(/<\/?[A-Za-z][^>]*>/g, '')
      .replace(/\[\s*\]\([^)]*\)|\[\s*\]\[[^\]]*\]/g, '')
      .replace(/\[([^\]]*)\](\([^)]*\)|\[[^\]]*\])/g, '$1')
      // An underscore inside a word (`max_depth`, NODE_DEBUG_NATIVE) is the word's own, as CommonMark reads it.
      .replace(/\*{1,2}([^*]+)\*{1,2}|(?<![\p{L}\p{N}])_{1,2}([^_]+)_{1,2}(?![\p{L}\p{N}])/gu, '$1$2')
  );
}

/** The front matter at the top of a document (`---` … `---`): the lines it spans and its `title`, if any. */
function frontMatter(lines: readonly string[]): { readonly end: number; readonly title?: string } {
  if (lines[0]?.trim() !== '---') return { end: 0 };
  for (let i = 1; i < lines.length; i++) {
    if (/^(---|\.\.\.)\s*$/.test(lines[i]!)) {
      const title = lines
        .slice(1, i)
        .map((line) => /^title\s*:\s*(.+?)\s*$/i.exec(line)?.[1])
        .find((t) => t !== undefined);
      return { end: i + 1, ...(title !== undefined && { title: title.replace(/^(['"])(.*)\1$/, '$2') }) };
    }
    // A key: value line, a list entry or a blank: YAML; anything else means the `---` was a rule.
    if (!/^(\s*[\w-]+\s*:|\s+|\s*-\s|\s*$)/.test(lines[i]!)) return { end: 0 };
  }
  return { end: 0 };
}

/**
 * Splits markdown into passages: one per paragraph, list, fenced code block or table (a long table
 * in pieces of 12 rows, each with its header; a paragraph ending in `:` stays with the block it
 * introduces; a long list in pieces of whole items), each cited by its file and nearest heading and
 * carrying its heading path (`headings`, e.g. `Guide › Install`) for retrieval. Headings (ATX `#` and
 * setext underlines) and label paragraphs (`LABEL`) are structure, not passages; a horizontal rule
 * (`---`, `***`, `___`) only separates; front matter is skipped, its `title` standing above the
 * document's headings. Plain text
 * is paragraphs. Ids are `file#heading-slug-n`, stable while the document's structure is.
 */
export function chunkMarkdown(markdown: string, file: string): Passage[] {
  const lines = markdown.split(/\r?\n/);
  const front = frontMatter(lines);
  const passages: Passage[] = [];
  const path: string[] = []; // path[level - 1]: the heading in force at that level
  let block: string[] = [];
  let fence: string | undefined;
  const perHeading = new Map<string, number>();
  const nearest = (): string | undefined => path.findLast((h) => h !== undefined && h !== '');
  const emit = (text: string): void => {
    const heading = nearest();
    const key = slug(heading ?? file);
    const n = (perHeading.get(key) ?? 0) + 1;
    perHeading.set(key, n);
    const headings = [front.title, ...path].filter((h): h is string => h !== undefined && h !== '').join(' › ');
    passages.push({
      id: `${file}#${key}-${n}`,
      text,
      source: heading === undefined ? file : `${file} › ${heading}`,
      ...(headings !== '' && { headings }),
    });
  };
  let leadIn: string | undefined; // a paragraph ending in `:` waits for the block it introduces
  let labelled = false; // the last of `path` is a label paragraph's (`LABEL`), below the headings
  const flush = (): void => {
    let text = block.join('\n').trim();
    block = [];
    if (text.length === 0) return;
    if (leadIn === undefined && LABEL.test(text)) {
      if (labelled) path.length -= 1;
      path.push(plain(text));
      labelled = true;
      return;
    }
    if (leadIn !== undefined) {
      text = `${leadIn}\n\n${text}`;
      leadIn = undefined;
    } else if (text.endsWith(':') && !TABLE_ROW.test(text.split('\n').at(-1)!)) {
      leadIn = text;
      return;
    }
    const lines = text.split('\n');
    if (lines.every((line) => TABLE_ROW.test(line))) for (const piece of tablePieces(lines)) emit(piece);
    else for (const piece of listPieces(text)) emit(piece);
  };
  const endSection = (): void => {
    flush();
    if (leadIn !== undefined) emit(leadIn);
    leadIn = undefined;
  };
  const setHeading = (level: number, text: string): void => {
    labelled = false;
    path.length = level;
    path[level - 1] = plain(text);
  };
  // The last line closing an HTML comment: an opener after it is no block, and none is looked for past it.
  const lastClose = lines.findLastIndex((line) => line.includes('-->'));
  for (let i = front.end; i < lines.length; i++) {
    const line = lines[i]!;
    if (fence !== undefined) {
      block.push(line);
      // A blank line or a heading inside a fenced block is code, not structure.
      if (line.trim().startsWith(fence)) {
        fence = undefined;
        flush();
      }
      continue;
    }
    // An HTML comment over several paragraphs (Node's `<!-- YAML` history) is one block, as CommonMark reads it: never prose.
    if (COMMENT_OPEN.test(line) && i < lastClose && !line.slice(line.indexOf('<!--') + 4).includes('-->')) {
      let close = i + 1;
      while (!lines[close]!.includes('-->')) close++;
      flush();
      block = lines.slice(i, close + 1);
      flush();
      i = close;
      continue;
    }
    const opens = FENCE.exec(line);
    if (opens !== null) {
      flush();
      fence = opens[1]!;
      block.push(line);
      continue;
    }
    const atx = HEADING.exec(line);
    if (atx !== null) {
      endSection();
      setHeading(atx[1]!.length, atx[2]!);
      continue;
    }
    // `Title` over `===` or `---` is a heading, when the paragraph is that one line.
    if (SETEXT.test(line) && block.length === 1 && !LIST_ITEM.test(block[0]!) && !TABLE_ROW.test(block[0]!)) {
      const text = block[0]!;
      block = [];
      endSection();
      setHeading(line.trim().startsWith('=') ? 1 : 2, text.trim());
      continue;
    }
    if (RULE.test(line) || line.trim() === '') {
      flush();
      continue;
    }
    // A table starts a block of its own, so the prose before it stays a passage.
    if (TABLE_ROW.test(line) !== (block.length > 0 && TABLE_ROW.test(block.at(-1)!))) flush();
    block.push(line);
  }
  endSection();
  return passages;
}

/**
 * A block holding a long list in pieces: its top-level items (each with its continuation lines)
 * gathered up to `LIST_CHARS`, a lead-in before the list staying with the first. Anything else whole.
 */
function listPieces(text: string): string[] {
  if (text.length <= LIST_CHARS) return [text];
  const lines = text.split('\n');
  const first = lines.findIndex((line) => /^([-*+]|\d+[.)])\s+/.test(line));
  if (first === -1) return [text];
  const items: string[] = [];
  for (const [i, line] of lines.entries()) {
    if (i <= first || /^([-*+]|\d+[.)])\s+/.test(line)) items.push(line);
    else items[items.length - 1] += `\n${line}`;
  }
  // The lines before the first item (a lead-in) open the first piece.
  const head = items.splice(0, first).join('\n');
  const pieces: string[] = [];
  let current = head;
  for (const item of items) {
    if (current !== '' && current.length + item.length > LIST_CHARS && current !== head) {
      pieces.push(current);
      current = '';
    }
    current = current === '' ? item : `${current}\n${item}`;
  }
  if (current !== '') pieces.push(current);
  return pieces;
}

/** A table's rows in pieces of at most `TABLE_ROWS`, each piece under the table's header and separator. */
function tablePieces(rows: readonly string[]): string[] {
  const separator = rows.findIndex((row) => /^\s*\|(\s*:?-+:?\s*\|)+\s*$/.test(row));
  if (separator !== 1 || rows.length - 2 <= TABLE_ROWS) return [rows.join('\n')];
  const head = rows.slice(0, 2);
  const pieces: string[] = [];
  for (let at = 2; at < rows.length; at += TABLE_ROWS) pieces.push([...head, ...rows.slice(at, at + TABLE_ROWS)].join('\n'));
  return pieces;
}
