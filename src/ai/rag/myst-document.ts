/**
 * MyST, the Markdown of Sphinx and Jupyter Book (pip's, NumPy's and many Python projects' docs), as
 * the CommonMark the corpus's chunker reads: a directive fence (```` ```{note} ````, `:::{tip}`) is
 * read by its kind as reStructuredText's directives are (code as a fence, an admonition as a
 * labelled paragraph, `{eval-rst}` as reStructuredText), a role (`{ref}`Caching <caching>``) as
 * its text, and a target line (`(caching)=`) says nothing.
 */
import { fenced } from './code-fence.js';
import { CODE_DIRECTIVES, LABEL_DIRECTIVES, rstToMarkdown, SILENT_DIRECTIVES } from './rst-document.js';

/** A directive fence's opening: its indent, its marker (three backticks or colons, or more), its name and argument. */
const OPENING = /^(\s*)(`{3,}|:{3,})\{([\w:.-]+)\}\s*(.*)$/;
/** A target line: a label for cross-references, nothing to read. */
const TARGET = /^\s*\([\w.:-]+\)=\s*$/;
/** A role: its name and content. */
const ROLE = /\{([\w:.-]+)\}`([^`]*)`/g;
/** Roles that refer to another page or section: read as their text. */
const REFERENCES = new Set(['ref', 'doc', 'term', 'numref', 'any', 'download', 'pypi', 'external', 'abbr']);

/** Whether Markdown `text` uses MyST's syntax: a directive fence, a target line or a role. */
export function isMyst(text: string): boolean {
  return /^\s*(?:`{3,}|:{3,})\{[\w:.-]+\}/m.test(text) || /^\s*\([\w.:-]+\)=\s*$/m.test(text) || /\{[\w:.-]+\}`[^`]*`/.test(text);
}

/** The CommonMark of MyST `text`. */
export function mystToMarkdown(text: string): string {
  return translate(text.split(/\r?\n/)).join('\n');
}

function translate(lines: readonly string[]): string[] {
  const out: string[] = [];
  let fence: string | undefined;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    // A plain code fence is code: no directive, role or target inside it is MyST's.
    const plain = /^\s*(`{3,}|~{3,})(?![`~{])/.exec(line);
    if (fence !== undefined) {
      out.push(line);
      if (plain !== null && plain[1]!.startsWith(fence[0]!) && plain[1]!.length >= fence.length && line.trim() === plain[1]) fence = undefined;
      continue;
    }
    if (plain !== null) {
      fence = plain[1]!;
      out.push(line);
      continue;
    }
    if (TARGET.test(line)) continue;
    const opening = OPENING.exec(line);
    if (opening === null) {
      const definition = /^:\s+(.*)$/.exec(line);
      const term = out.at(-1);
      // A definition list (`Term` over `: what it is`) as list items, as reStructuredText's are read.
      if (definition !== null && term !== undefined && term.trim() !== '' && (out.at(-2) ?? '').trim() === '')
        out[out.length - 1] = `- ${term.trim()}: ${definition[1]!.replace(ROLE, role)}`;
      else out.push(line.replace(ROLE, role));
      continue;
    }
    const [, indent, marker, rawName, argument] = opening as unknown as [string, string, string, string, string];
    // The fence closes at a line of the same marker, at least as long: a longer one nests shorter ones.
    let end = i + 1;
    const closes = (candidate: string) => candidate.trim().startsWith(marker) && new RegExp(`^\\s*\\${marker[0]}{${marker.length},}\\s*$`).test(candidate);
    while (end < lines.length && !closes(lines[end]!)) end++;
    const body = lines.slice(i + 1, end).map((l) => (l.startsWith(indent) ? l.slice(indent.length) : l));
    // Options (`:caption: Example`) open the body, or a YAML block between `---` lines.
    let start = 0;
    if (body[0]?.trim() === '---') {
      const close = body.indexOf('---', 1);
      start = close === -1 ? 0 : close + 1;
    } else while (start < body.length && /^\s*:[\w-]+:/.test(body[start]!)) start++;
    out.push(...directive(rawName.toLowerCase().split(':').at(-1)!, argument.trim(), body.slice(start)));
    i = end;
  }
  return out;
}

/** What a directive fence reads as, by its kind. */
function directive(name: string, argument: string, body: string[]): string[] {
  const content = body.some((l) => l.trim() !== '');
  if (CODE_DIRECTIVES.has(name)) return fenced(body, argument.split(/\s/)[0]);
  if (name === 'eval-rst') return ['', rstToMarkdown(body.join('\n')), ''];
  if (name === 'toctree') return ['', ...body.filter((l) => l.trim() !== '').map((l) => `- ${l.trim()}`), ''];
  if (SILENT_DIRECTIVES.has(name) || (!content && !LABEL_DIRECTIVES.has(name))) return [];
  // A project's own directive over a shell session (`{pip-cli}`) holds commands, not prose.
  if (!LABEL_DIRECTIVES.has(name) && body.every((l) => l.trim() === '' || /^\s*(?:\$|>>>|>|[A-Z]:\\[^>]*>)\s/.test(l))) return fenced(body, 'console');
  const inner = translate(body);
  if (!LABEL_DIRECTIVES.has(name)) return argument === '' ? ['', ...inner, ''] : ['', `${argument.replace(ROLE, role)}:`, '', ...inner, ''];
  // An admonition or a version note: its label, then its content, as reStructuredText's are read.
  // A generic admonition's argument is its title; any other's label is its kind, then its argument.
  const words = name === 'admonition' && argument !== '' ? argument : `${name.replace(/^version/, 'version ').replace(/-/g, ' ')} ${argument}`.trim();
  const label = `${words[0]!.toUpperCase()}${words.slice(1)}:`;
  const first = inner.findIndex((l) => l.trim() !== '');
  // A label opens the first paragraph, never a fence, a heading or a table.
  if (first === -1) return ['', label, ''];
  if (/^\s*(?:`{3,}|~{3,}|#|\|)/.test(inner[first]!)) return ['', label, '', ...inner, ''];
  inner[first] = `${label} ${inner[first]!.trimStart()}`;
  return ['', ...inner, ''];
}

/** A role as its text: a reference as its title (`{ref}`Caching <caching>`` as Caching), a PEP by number, anything else as code. */
function role(_: string, rawName: string, content: string): string {
  const name = rawName.split(':').at(-1)!;
  const text = content.replace(/\s*<[^>]*>$/, '').replace(/^[~!]/, '') || content.replace(/^<|>$/g, '');
  if (name === 'pep') return `PEP ${text}`;
  if (REFERENCES.has(name)) return text;
  return `\`${text}\``;
}
