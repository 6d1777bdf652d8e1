/**
 * The quotable pieces of a passage: prose split into sentences, each code line as a code span and
 * each table row with its header's cells named, so a command or a row can be the quoted answer.
 */

const segmenter = new Intl.Segmenter('en', { granularity: 'sentence' });

/** A table row's cells, trimmed, without the outer pipes. */
function cells(row: string): string[] {
  return row
    .trim()
    .replace(/^\||\|$/g, '')
    .split('|')
    .map((cell) => cell.trim());
}

/** A blockquote's markers at the start of a line (`> `, `> > `). */
const BLOCKQUOTE = /^\s{0,3}(?:>\s?)+/;
/** A GitHub alert's label line inside a blockquote: `[!NOTE]`, `[!CAUTION]`. */
const ALERT = /^\s*\[!\w+\]\s*$/;

const TABLE_SEPARATOR = /^\s*\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*$/;

/** An HTML tag in prose (`<details>`, `<br/>`, `</summary>`): markup a reader never sees. Code spans are masked before it is applied. */
const HTML_TAG = /<\/?[A-Za-z][\w-]*(?:\s[^<>]*)?\/?>/g;

/** An HTML comment in prose (`<!-- hidden until released -->`): written for the page's editors, not its readers. */
const HTML_COMMENT = /<!--[\s\S]*?-->/g;
/** An image (`![alt](src)`, `![alt][ref]`): a badge or a picture, nothing a reader is told. Applied with links masked. */
const IMAGE = /!\[[^\]]*\](?:\([^)]*\)|\[[^\]]*\])/g;
/** A link left with no text once its image is gone (`[![build](…)](…)`). */
const EMPTY_LINK = /\[\s*\](?:\([^)]*\)|\[[^\]]*\])/g;

/** A piece without the `**` a sentence split left unpaired (`**Cancel reaches it. It aborts…**` cut after the first period). */
function unpaired(piece: string): string {
  const trimmed = piece.trim();
  if ((trimmed.match(/\*\*/g) ?? []).length % 2 === 0) return piece;
  if (trimmed.startsWith('**')) return trimmed.slice(2);
  const last = trimmed.lastIndexOf('**');
  return trimmed.slice(0, last) + trimmed.slice(last + 2);
}

/** A table row as a sentence: each cell after its column's header (`Code: 429; Meaning: rate limited`). */
function rowSentence(header: readonly string[] | undefined, row: string): string {
  const values = cells(row).map((cell) => (cell.includes('`') ? cell : cell.replace(HTML_TAG, ' ').replace(/\s+/g, ' ').trim()));
  if (header === undefined) return values.filter((v) => v !== '').join('; ');
  return values
    .map((value, i) => (header[i] ? `${header[i]}: ${value}` : value))
    .filter((_, i) => values[i] !== '')
    .join('; ');
}

/** A code line worth quoting: something to run or read, not a brace, a blank or a lone comment marker. */
function codeSentence(line: string): string | undefined {
  const code = line.trim();
  if (code.length > 160 || (code.match(/[\p{L}\p{N}]+/gu) ?? []).length < 2) return undefined;
  return `\`${code.replace(/`/g, "'")}\``;
}

/** A code line that is only a comment (`# Only failed actions`, `// retry twice`): with the comment lines before it, it says what the line below does, and nothing alone. */
const COMMENT_LINE = /^\s*(#|\/\/)\s/;

/** Comment lines quoted with a code line at most, the nearest: a longer block documents more than the line below it. */
const COMMENT_LINES = 4;

/** A statement spread over lines (`new Agent({` … `})`) is quoted whole, as one code span, while under this many characters. */
const STATEMENT = 200;

/** The bracket depth a line leaves open: its openers minus its closers, string literals aside. */
function depthOf(line: string): number {
  const bare = line.replace(/(['"`])(?:\\.|(?!\1).)*\1/g, '');
  return (bare.match(/[({[]/g)?.length ?? 0) - (bare.match(/[)}\]]/g)?.length ?? 0);
}

/**
 * The quotable code of one fence: each statement as a code span, with the comment lines just above
 * it. A line that opens a call or a literal it does not close (`getToken({`) is one statement with the
 * lines up to its close, while short: its arguments are what it says.
 */
function fenceSentences(lines: readonly string[]): string[] {
  const out: string[] = [];
  let comment: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const code = codeSentence(line);
    if (code === undefined) continue;
    // Comment lines in a row are one comment, quoted with the line it describes (it holds the words, the line the command), never alone.
    if (COMMENT_LINE.test(line)) {
      comment = [...comment, code].slice(-COMMENT_LINES);
      continue;
    }
    let statement = code;
    let depth = depthOf(line);
    if (depth > 0) {
      const parts = [line.trim()];
      const notes: string[] = []; // the comments inside it, quoted before it as comment lines are
      let end = i;
      while (depth > 0 && end + 1 < lines.length) {
        const text = lines[++end]!.trim();
        const note = /(?:^|\s)(\/\/.*)$/.exec(text);
        const next = note === null ? text : text.slice(0, note.index).trim();
        const quoted = note === null ? undefined : `\`${note[1]!.replace(/`/g, "'")}\``;
        if (quoted !== undefined && !notes.includes(quoted)) notes.push(quoted);
        depth += depthOf(next);
        if (next !== '') parts.push(next);
      }
      const joined = parts.join(' ');
      if (depth <= 0 && joined.length <= STATEMENT) {
        statement = `\`${joined.replace(/`/g, "'")}\``;
        comment = [...comment, ...notes].slice(-COMMENT_LINES);
        i = end;
      }
    }
    out.push([...comment, statement].join(' '));
    comment = [];
  }
  return out;
}

/** Prose words of a masked sentence, a code span counting as one: under `MIN_WORDS`, a piece is a fragment. */
const MIN_WORDS = 4;

/** A list item that is one attribute of what its heading names (`Default: 2`, `Type: Number`, `Required: yes`): a key, a colon, a short value. */
const ATTRIBUTE = /^\p{L}[\p{L}\p{N} _-]{0,24}:\s+\S/u;
/** An attribute item says its value in this many words at most; a longer item is prose. */
const ATTRIBUTE_WORDS = 8;

/** A list item that is only links (a table of contents, "See [`logger.level`](#level)" aside): navigation, not content. */
const LINKS_ONLY = /^(?:see(?: also)?:?\s+)?(?:\s*(?:[*_]{0,2}\[[^\]]*\]\([^)]*\)[*_]{0,2}|⇗|[,;|·-]))+\s*$/iu;

/** A block's lines joined by `; ` when every one is an attribute (`Type: \`boolean\``, a hard break's `\\` dropped); else undefined. */
function attributesOf(block: string): string | undefined {
  const lines = block
    .split(/\n|\\(?:\s+|$)/)
    .map((line) => line.replace(/\s+/g, ' ').trim())
    .filter((line) => line !== '');
  if (lines.length === 0 || !lines.every((line) => ATTRIBUTE.test(line) && line.split(' ').length <= ATTRIBUTE_WORDS)) return undefined;
  return lines.join('; ');
}

/** A list item that only names a thing: one code span (`` `BROTLI_PARAM_QUALITY` ``), its nested items describing it. */
const NAME_ITEM = /^`[^`]+`$/;

/** A list item that opens by naming something in code: an option, a property, a member. */
const NAMED_ITEM = /^`[^`\s]+`/;
/** A lead-in sentence ending in `:` takes the list items or code lines after it while it stays under this many characters. */
const LEAD_IN_LIST = 240;

/** What a passage holds to quote, in reading order, before prose is cut into sentences. */
interface Scanned {
  /** Prose blocks: paragraphs and list items, so a sentence never runs from one into the next. */
  readonly blocks: readonly string[];
  /** The blocks that are list items. */
  readonly items: ReadonlySet<number>;
  /** A code statement or table row as it is, or the index of a prose block. */
  readonly quotable: readonly (string | number)[];
  /** The fence a quotable code statement is in, by its index in `quotable`. */
  readonly fenceOf: ReadonlyMap<number, number>;
}

/** A passage's blocks: prose, code fences cut into statements, table rows named by their header. */
function scan(text: string): Scanned {
  const blocks: string[] = [];
  const items = new Set<number>();
  const quotable: (string | number)[] = [];
  const fenceOf = new Map<number, number>();
  let fences = 0;
  let current: string[] = [];
  let item = false;
  // The list items open around the line, by indent; one that only names a thing (`BROTLI_PARAM_QUALITY`) keeps its block and the items it took.
  let open: { readonly indent: number; name?: string; block?: number; took?: number }[] = [];
  // The open item the current one is nested in, when that one only names a thing.
  let named: { name?: string; block?: number; took?: number } | undefined;
  let fenced: string[] | undefined; // the lines of the open code fence
  let header: string[] | undefined;
  const close = () => {
    const text = current.join(' ');
    if (named?.name !== undefined && named.block !== undefined && text !== '') {
      // An item under one that only names a thing describes that thing: the name's block takes it, or it is quoted with the name.
      const took = named.took ?? 0;
      if (blocks[named.block]!.length + text.length + 2 <= LEAD_IN_LIST) {
        blocks[named.block] = `${blocks[named.block]}${took === 0 ? ': ' : '; '}${text}`;
        named.took = took + 1;
        current = [];
      } else current = [`${named.name}: ${text}`];
    }
    if (current.length > 0) {
      quotable.push(blocks.length);
      if (item) items.add(blocks.length);
      const block = current.join(' ');
      if (item && open.length > 0 && NAME_ITEM.test(block)) Object.assign(open.at(-1)!, { name: block, block: blocks.length });
      blocks.push(block);
    }
    named = undefined;
    current = [];
    item = false;
  };
  const closeFence = () => {
    fences++;
    for (const code of fenceSentences(fenced ?? [])) {
      fenceOf.set(quotable.length, fences);
      quotable.push(code);
    }
    fenced = undefined;
  };
  let quotedFence = false; // the open fence is inside a blockquote: its lines carry `>` too
  const lines = text.split('\n');
  for (const [i, raw] of lines.entries()) {
    // A blockquote's `>` markers are markup (a `> node` prompt inside a plain fence is code, kept).
    const quoted = BLOCKQUOTE.exec(raw);
    const line = quoted !== null && (fenced === undefined || quotedFence) ? raw.slice(quoted[0].length) : raw;
    if (/^\s*(```|~~~)/.test(line)) {
      close();
      if (fenced === undefined) {
        fenced = [];
        quotedFence = quoted !== null;
      } else closeFence();
      continue;
    }
    if (fenced !== undefined) {
      fenced.push(line);
      continue;
    }
    if (/^\s*\|/.test(line)) {
      close();
      if (TABLE_SEPARATOR.test(line)) continue;
      // A row followed by the separator is the header: it names the cells of the rows below.
      if (TABLE_SEPARATOR.test(lines[i + 1] ?? '')) header = cells(line);
      else quotable.push(rowSentence(header, line));
      continue;
    }
    header = undefined;
    // A heading, a blank, a link reference definition (`[docs]: https://…`) or an alert's label (`[!NOTE]`): nothing to quote.
    if (/^\s*#{1,6}\s/.test(line) || line.trim() === '' || /^\s*\[[^\]]+\]:\s*\S+/.test(line) || ALERT.test(line)) {
      close();
      continue;
    }
    const marker = /^(\s*)([-*+]|\d+\.)\s+/.exec(line);
    if (marker !== null) {
      close();
      item = true;
      const indent = marker[1]!.length;
      open = open.filter((o) => o.indent < indent);
      named = open.at(-1)?.name === undefined ? undefined : open.at(-1);
      open.push({ indent });
    } else if (current.length === 0 && !/^\s/.test(line)) open = [];
    current.push(marker === null ? line.trim() : line.slice(marker[0].length).trim());
  }
  close();
  if (fenced !== undefined) closeFence();
  return { blocks, items, quotable, fenceOf };
}

/** A piece of a passage to quote, and the block it belongs to: a paragraph, a list item, a code fence or a table row. */
export interface Quotable {
  readonly text: string;
  /** Pieces of one paragraph, list item or fence share it; each table row has its own. */
  readonly block: number;
  /** An attribute list (`Default: 2; Type: Number`): values of what its heading names. */
  readonly attributes?: true;
}

/**
 * A passage's quotable pieces, trimmed: prose split into sentences (a fragment of fewer than 4 words
 * joined to the sentence before it in its block, or dropped when it opens one; list markers and
 * headings left out), each statement of a code fence as a code span (with the comment lines just
 * above it; a comment alone is not quoted), and each table row with its header's cells named, so a
 * command or a row can be the quoted answer; a sentence ending in `:` keeps the first row it
 * introduces, or the code lines or list items after it while under 240 characters, and a list item
 * that only names a thing (`` `BROTLI_PARAM_MODE` ``) the items nested under it.
 */
export function quotablesOf(text: string): Quotable[] {
  const { blocks, items, quotable, fenceOf } = scan(text);
  const out: Quotable[] = [];
  const add = (piece: string, block: number) => out.push({ text: piece, block });
  const extend = (piece: string, separator = ' ') => {
    const last = out.pop()!;
    out.push({ ...last, text: `${last.text}${separator}${piece}` });
  };
  // The last sentence ends in `:`: the code line or row after it (or list items, `listed` of them so far) is what it introduces.
  let leadIn = false;
  let listed = 0;
  // The fence whose first code line a lead-in took: its next lines join it too, while it stays short.
  let leadFence: number | undefined;
  // The list item last quoted as an attribute: the next item, if one too, joins it (`Default: 2; Type: Number`).
  let attributeAt: number | undefined;
  // The short list item last quoted: the next one joins it (`\`reset\`; \`bold\`; \`dim\``).
  let shortAt: number | undefined;
  // Pieces that say nothing unless something joins them (a lead-in fragment, a lone short item): dropped if nothing does.
  const bare = new Set<Quotable>();
  const addBare = (piece: Quotable) => {
    out.push(piece);
    bare.add(piece);
  };
  for (const [at, entry] of quotable.entries()) {
    if (typeof entry === 'string') {
      if (entry.length === 0) continue;
      const fence = fenceOf.get(at);
      if (leadFence !== undefined && fence === leadFence && out.at(-1)!.text.length + entry.length < LEAD_IN_LIST) {
        extend(entry);
        continue;
      }
      leadFence = leadIn ? fence : undefined;
      if (leadIn) extend(entry);
      // Statements of one fence are one block; each row is its own.
      else add(entry, fence === undefined ? blocks.length + at : -fence);
      leadIn = false;
      continue;
    }
    leadFence = undefined;
    if (leadIn && items.has(entry)) {
      const item = blocks[entry]!.replace(/\s+/g, ' ').trim();
      if (out.at(-1)!.text.length + item.length + 2 <= LEAD_IN_LIST) {
        extend(item, listed === 0 ? ' ' : '; ');
        listed++;
        continue;
      }
    }
    leadIn = false;
    listed = 0;
    const attribute = attributesOf(blocks[entry]!);
    if (attribute !== undefined) {
      // An option's attributes ("* Default: 2" / "* Type: Number", or "Type: `boolean`\" / "Default: `false`") are one piece, quoted: alone each is a fragment, together they state the option.
      if (items.has(entry) && attributeAt === entry - 1) extend(attribute, '; ');
      else out.push({ text: attribute, block: entry, attributes: true });
      attributeAt = items.has(entry) ? entry : undefined;
      continue;
    }
    attributeAt = undefined;
    const item = items.has(entry) ? blocks[entry]!.replace(/\s+/g, ' ').trim() : '';
    if (item !== '' && item.split(' ').length < MIN_WORDS && !LINKS_ONLY.test(item)) {
      // A list of names (`reset`, `bold`…; NFD, NFKC…) is one piece: alone each item is a fragment, together they answer "which are there".
      if (shortAt === entry - 1 && out.at(-1)!.text.length + item.length + 2 <= LEAD_IN_LIST) extend(item, '; ');
      else addBare({ text: item, block: entry });
      shortAt = entry;
      continue;
    }
    shortAt = undefined;
    // An item naming an option or a member (`` `cost` {number} Cost. Must be a power of two. **Default:** `16384`. ``) says it whole: its later sentences lose the name alone.
    if (item !== '' && NAMED_ITEM.test(item) && item.length <= LEAD_IN_LIST) {
      add(item, entry);
      leadIn = item.endsWith(':');
      continue;
    }
    const first = out.length;
    // Code spans, links and abbreviations are masked while splitting, so `nak(millis?)`, `show_bug.cgi?id=1` or "e.g. 30" never ends a sentence.
    const masked: string[] = [];
    const block = blocks[entry]!.replace(HTML_COMMENT, ' ')
      .replace(/`[^`]*`|\bhttps?:\/\/[^\s)\]>]+|\b(?:e\.g|i\.e|etc|vs|cf)\./g, (span) => `\u{E000}${masked.push(span) - 1}\u{E001}`)
      .replace(HTML_TAG, ' ')
      .replace(IMAGE, ' ')
      .replace(EMPTY_LINK, ' ');
    const unmask = (piece: string) => piece.replace(/\u{E000}(\d+)\u{E001}/gu, (_, i: string) => masked[Number(i)]!);
    // A fragment opening the block, held in case the sentence goes on after it.
    let opening = { text: '', words: 0 };
    for (const { segment } of segmenter.segment(block)) {
      // The segmenter keeps "… `OverflowError`. `conflate` merges …" together: split before a code span too.
      for (const part of segment.split(/(?<=[.!?])\s+(?=[\u{E000}[(A-Z])/u)) {
        let sentence = unmask(unpaired(part)).replace(/\s+/g, ' ').trim();
        let words = part.trim().split(/\s+/).length;
        // The segmenter ends a sentence at any `?` or `!`, even one quoted mid-sentence (`It logs "Done!" once…`): no sentence opens in lower case.
        const goesOn = /^\p{Ll}/u.test(sentence);
        if (opening.words > 0) {
          if (goesOn) [sentence, words] = [`${opening.text} ${sentence}`, opening.words + words];
          opening = { text: '', words: 0 };
        } else if (goesOn && out.length > first) {
          extend(sentence);
          leadIn = sentence.endsWith(':');
          continue;
        }
        if (words < MIN_WORDS) {
          // A fragment ("Default: `5`.") finishes the sentence before it in its block; alone it says nothing.
          if (out.length > first && sentence !== '') extend(sentence);
          else if (sentence !== '') opening = { text: sentence, words };
          continue;
        }
        add(sentence, entry);
        leadIn = sentence.endsWith(':');
      }
    }
    if (opening.words > 0 && opening.text.endsWith(':')) {
      // A short lead-in ("Optional parameters:") is quoted with the items, code or row it introduces, not alone.
      addBare({ text: opening.text, block: entry });
      leadIn = true;
    }
  }
  return bare.size === 0 ? out : out.filter((piece) => !bare.has(piece));
}

/** The text of each of a passage's quotable pieces (`quotablesOf`). */
export function sentencesOf(text: string): string[] {
  return quotablesOf(text).map((q) => q.text);
}
