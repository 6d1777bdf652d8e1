/**
 * A Markdown code fence around lines of code, for documents translated to Markdown (reStructuredText,
 * AsciiDoc): its backticks outnumber any run opening a line of the code, so that no line closes it.
 */

/** `code` in a fence of `language` (none when empty), with a blank line on each side. */
export function fenced(code: readonly string[], language = ''): string[] {
  const marker = '`'.repeat(Math.max(3, ...code.map((line) => (/^\s*(`+)/.exec(line)?.[1]?.length ?? 0) + 1)));
  return ['', `${marker}${language}`, ...code, marker, ''];
}
