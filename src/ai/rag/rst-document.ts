/**
 * A reStructuredText page (Sphinx and docutils documentation) as the Markdown the corpus's chunker
 * reads: section titles by their adornment, literal blocks and code directives as fences,
 * admonitions as labelled paragraphs, roles and links as their text. No well-kept JavaScript parser
 * of reStructuredText exists; this reads what carries a page's structure and leaves the rest as text.
 */
import { fenced } from './code-fence.js';

/** A line of one punctuation character repeated: a title's adornment, or a transition. */
const ADORNMENT = /^([!-/:-@[-`{-~])\1{2,}\s*$/;
/** A directive (`.. note::`, `.. code-block:: python`): its name and argument. */
const DIRECTIVE = /^\.\.\s+([\w:-]+)::\s*(.*)$/;
/** Directives whose content is code: quoted as a fence in the language their argument names. */
export const CODE_DIRECTIVES = new Set(['code-block', 'code', 'sourcecode', 'literalinclude', 'doctest', 'testcode', 'parsed-literal']);
/** Directives with nothing a reader reads: images, raw output, indexes. */
export const SILENT_DIRECTIVES = new Set([
  'image',
  'figure',
  'raw',
  'include',
  'contents',
  'index',
  'meta',
  'sectnum',
  'autosummary',
  'highlight',
  'currentmodule',
  'module',
  'default-role',
  'role',
  'tabularcolumns',
]);

/**
 * Directives that label their content rather than head it: admonitions and version notes. Any other
 * directive with an argument and content documents an object (`.. py:function:: open(file)`,
 * `.. option:: --verbose`, a project's own `.. genex:: $<CONFIG>`), as Sphinx's object descriptions do.
 */
export const LABEL_DIRECTIVES = new Set([
  'note',
  'warning',
  'tip',
  'important',
  'caution',
  'danger',
  'error',
  'hint',
  'attention',
  'admonition',
  'seealso',
  'todo',
  'versionadded',
  'versionchanged',
  'deprecated',
  'topic',
  'sidebar',
  'rubric',
  'only',
  'container',
  'centered',
]);

/** Whether a document's file name says it is reStructuredText. */
export function isRstFile(file: string): boolean {
  return /\.(rst|rest)$/i.test(file);
}

const indentOf = (line: string): number => line.length - line.trimStart().length;
const blank = (line: string | undefined): boolean => line === undefined || line.trim() === '';

/** Whether `line` (with the one after it) opens a paragraph of prose: not markup, a title or a block's start. */
function isProse(line: string, next: string | undefined): boolean {
  return !/^\s*(?:\.\.|[-*+•]\s|\d+[.)]\s|:)/.test(line) && !ADORNMENT.test(line) && (next === undefined || !ADORNMENT.test(next)) && !/::\s*$/.test(line);
}

/** The block indented under line `start` (its blank lines inside), dedented, and the index after it. */
function indentedBlock(lines: readonly string[], start: number, base: number): { readonly block: string[]; readonly next: number } {
  let end = start;
  while (end < lines.length && (blank(lines[end]) || indentOf(lines[end]!) > base)) end++;
  while (end > start && blank(lines[end - 1])) end--;
  let begin = start;
  while (begin < end && blank(lines[begin])) begin++;
  const body = lines.slice(begin, end);
  const margin = Math.min(...body.filter((l) => !blank(l)).map(indentOf));
  return { block: body.map((l) => (blank(l) ? '' : l.slice(Number.isFinite(margin) ? margin : 0))), next: end };
}

/** Inline markup as its text: `` :func:`os.path.join` `` as code, `` `text <url>`_ `` and `` :ref:`Title <label>` `` as the title. */
function inline(line: string): string {
  return line
    .replace(/``([^`]+)``/g, '`$1`')
    .replace(/:(?:ref|doc|term|numref|download|any):`([^`<]*?)\s*(?:<[^`>]*>)?`/g, (_, text: string) => text)
    .replace(/:[\w.+-]+(?::[\w.+-]+)?:`~?([^`]+)`/g, (_, text: string) => `\`${text.replace(/\s*<[^>]*>$/, '')}\``)
    .replace(/`([^`<]+?)\s*<[^`>]+>`__?/g, '$1')
    .replace(/`([^`]+)`__?(?=\W|$)/g, '$1');
}

/** The Markdown of reStructuredText `text`. */
export function rstToMarkdown(text: string): string {
  const levels = new Map<string, number>();
  let level = 0;
  const heading = (style: string, title: string): string => {
    if (!levels.has(style)) levels.set(style, Math.min(6, levels.size + 1));
    level = levels.get(style)!;
    return `${'#'.repeat(level)} ${inline(title.trim())}`;
  };
  const out: string[] = [];
  // A block read apart (an admonition's content, a definition) is read as the page's own lines, where it stands.
  const read = (lines: string[]): void => {
    let i = 0;
    while (i < lines.length) {
      const line = lines[i]!;
      const next = lines[i + 1];
      const over = ADORNMENT.exec(line);
      // A title between an overline and an underline of the same character.
      if (over !== null && next !== undefined && !blank(next) && lines[i + 2]?.trim() === line.trim()) {
        out.push('', heading(`${over[1]}/over`, next), '');
        i += 3;
        continue;
      }
      // A title over its underline (at least as long as three characters: "Usage" over "=====").
      const under = next === undefined ? null : ADORNMENT.exec(next);
      if (under !== null && !blank(line) && indentOf(line) === 0 && over === null && blank(lines[i - 1])) {
        out.push('', heading(under[1]!, line), '');
        i += 2;
        continue;
      }
      // A transition, or an adornment left alone: a fence opener to Markdown (`~~~`) if kept.
      if (over !== null) {
        out.push('');
        i++;
        continue;
      }
      const directive = DIRECTIVE.exec(line.trim());
      if (line.trim().startsWith('..')) {
        const base = indentOf(line);
        let start = i + 1;
        // A directive's options (`:linenos:`, `:caption: x`) come before its content.
        while (start < lines.length && /^\s+:[\w-]+:/.test(lines[start]!) && indentOf(lines[start]!) > base) start++;
        const { block, next: after } = indentedBlock(lines, start, base);
        // A domain's directive (`py:function`, `c:macro`) is read by its kind.
        const name = directive?.[1]?.toLowerCase().split(':').at(-1);
        const argument = directive?.[2]?.trim() ?? '';
        if (name !== undefined && CODE_DIRECTIVES.has(name)) out.push(...fenced(block, argument.split(/\s/)[0]));
        else if (name === 'toctree') {
          // The pages a table of contents links to, as the list of links a reader sees (`/generator/Ninja` as Ninja): names a search finds, never quoted.
          const entries = block.filter((entry) => !blank(entry) && !entry.trim().startsWith(':'));
          const link = (entry: string) => {
            const titled = /^(.*?)\s*<([^>]*)>$/.exec(entry);
            return titled !== null ? `[${titled[1]}](${titled[2]})` : `[${entry.split('/').at(-1)}](${entry})`;
          };
          out.push('', ...entries.map((entry) => `- ${link(entry.trim())}`), '');
        } else if (name !== undefined && !LABEL_DIRECTIVES.has(name) && !SILENT_DIRECTIVES.has(name) && argument !== '' && block.length > 0) {
          // Its own section, a level below the one it is written in, so that its description is found under its name.
          // In a code span, so that a signature's `<...>` (`$<TARGET_FILE:tgt>`) is not read as an HTML tag.
          out.push('', `${'#'.repeat(Math.min(6, level + 1))} ${argument.includes('`') ? inline(argument) : `\`${argument}\``}`, '');
          out.push('');
          read(block);
          out.push('');
          i = after;
          continue;
        } else if (name !== undefined && !SILENT_DIRECTIVES.has(name) && (LABEL_DIRECTIVES.has(name) || block.length > 0)) {
          // An admonition or a versioned note: its label, its argument, then its content as the page's own lines.
          // A project's own directive without content (`.. pip-command-usage:: cache`) writes its text at build time: nothing to read here.
          const words = `${name.replace(/^version/, 'version ').replace(/-/g, ' ')} ${argument}`.trim();
          const label = `${words[0]!.toUpperCase()}${words.slice(1)}:`;
          let following = after;
          while (following < lines.length && blank(lines[following])) following++;
          const paragraph = lines[following];
          // A version note without content dates the paragraph after it (`.. versionadded:: 3.17` over the variant it added).
          if (block.length === 0 && paragraph !== undefined && /^version|^deprecated/.test(name) && isProse(paragraph, lines[following + 1]))
            lines[following] = `${label} ${paragraph.trimStart()}`;
          else if (block.length === 0) out.push('', inline(label));
          else block[0] = `${label} ${block[0]}`;
          out.push('');
          read(block);
          out.push('');
          i = after;
          continue;
        }
        // Comments, link targets (`.. _label:`), substitutions and silent directives say nothing.
        i = after;
        continue;
      }
      // A paragraph ending in `::` introduces the literal block indented under it.
      if (/::\s*$/.test(line) && blank(next)) {
        let start = i + 1;
        while (start < lines.length && blank(lines[start])) start++;
        if (start < lines.length && indentOf(lines[start]!) > indentOf(line)) {
          const lead = line.replace(/\s*::\s*$/, line.trim() === '::' ? '' : ':');
          if (lead.trim() !== '') out.push(inline(lead.trimStart()));
          const { block, next: after } = indentedBlock(lines, start, indentOf(line));
          out.push(...fenced(block));
          i = after;
          continue;
        }
      }
      // A line over a more indented one is a definition list's term (`OUTPUT_FORMAT` over what it does): a list item of both.
      if (!blank(line) && !blank(next) && indentOf(next!) > indentOf(line) && !/::\s*$/.test(line) && !/^\s*(?:[-*+•]\s|\d+[.)]\s|#\.\s|:|\.\.)/.test(line)) {
        const { block, next: after } = indentedBlock(lines, i + 1, indentOf(line));
        const term = `- ${line.trim()}:`;
        if (block[0] !== undefined && !block[0].startsWith('..')) block[0] = `${term} ${block[0]}`;
        else block.unshift(term);
        out.push('');
        read(block);
        out.push('');
        i = after;
        continue;
      }
      // Indentation is a block quote or a list's continuation in reStructuredText, never code as in Markdown;
      // a field (`:param file: the path`) reads as its name and value.
      out.push(inline(line.trimStart().replace(/^:([^:`]+):(?=\s|$)/, '$1:')));
      i++;
    }
  };
  read(text.replace(/\r\n?/g, '\n').split('\n'));
  return `${out
    .join('\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim()}\n`;
}
