/**
 * Citations a language model writes, checked rather than trusted: a `[n]` naming a passage of
 * the context passes, any other `[n]` (a source it made up) is left out of the answer, and what
 * was cited is kept for the source list. Works on streamed text: a marker split across tokens
 * is held back (a few characters at most) until it is whole.
 */

/** Longest marker number: `[999]`. */
const DIGITS = 3;

export class CitationFilter {
  /** Markers of the context's passages that the text cited, in order of first citation. */
  readonly cited = new Set<number>();
  /** Markers the text wrote that name no passage of the context: left out. */
  invalid = 0;
  private held = '';

  constructor(private readonly valid: ReadonlySet<number>) {}

  /** The part of `text` (after what was held) that can be let out now. */
  push(text: string): string {
    const s = this.held + text;
    this.held = '';
    let out = '';
    let i = 0;
    while (i < s.length) {
      const open = s.indexOf('[', i);
      if (open < 0) {
        out += s.slice(i);
        break;
      }
      out += s.slice(i, open);
      let end = open + 1;
      while (end < s.length && end - open - 1 < DIGITS && s.charCodeAt(end) >= 48 && s.charCodeAt(end) <= 57) end++;
      if (end === s.length) {
        // `[` or `[12` at the end: the next token may finish it as a marker.
        this.held = s.slice(open);
        break;
      }
      if (end === open + 1 || s[end] !== ']') {
        out += s.slice(open, end);
        i = end;
        continue;
      }
      const marker = Number(s.slice(open + 1, end));
      if (this.valid.has(marker)) {
        this.cited.add(marker);
        out += s.slice(open, end + 1);
      } else this.invalid++;
      i = end + 1;
    }
    return out;
  }

  /** What is still held at the end of the text (an unfinished `[12`, let out as it is). */
  flush(): string {
    const rest = this.held;
    this.held = '';
    return rest;
  }
}
