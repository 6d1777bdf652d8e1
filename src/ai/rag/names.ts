/**
 * The names a question uses: words written as names (`PostgreSQL`, `PDF`, `Kubernetes` in mid
 * sentence), which say what the question is about whatever its other words. A corpus that never
 * mentions one does not cover the question, however many of its other words it holds.
 */

/** A word with its inner joins (`Node.js`, `Wi-Fi`, `C++`): what a name is written as. */
const WORD = /[\p{L}\p{N}](?:[\p{L}\p{N}]|[.+#-](?=[\p{L}\p{N}+#]))*[+#]*/gu;

/** Capitalised words that name nothing. */
const NOT_NAMES = new Set(['I', 'OK']);

/** Names looked up at most, per text: a long text names no more subjects than this that matter. */
const MAX_NAMES = 32;

/** A member of a module or object as code writes it (`fs.watch`, `dns.lookup`, `logger.child`): lower-case identifiers joined by dots. */
const MEMBER = /^[a-z_$][\w$]*(?:\.[a-z_$][\w$]*)+$/;
/** The last part of a file's name (`package.json`, `cmd.exe`), not a member. */
const EXTENSION = /\.(?:[cm]?[jt]sx?|json5?|mdx?|markdown|ya?ml|toml|ini|txt|html?|css|exe|sh|lock|log|env)$/i;

/** Whether `word` is a member of a module or object in code (`fs.watch`), not a file name (`package.json`) nor an abbreviation (`e.g`). */
export function isCodeMember(word: string): boolean {
  return MEMBER.test(word) && !EXTENSION.test(word) && word.split('.').every((part) => part.length >= 2);
}

/**
 * The distinct words of `text` written as names: two capitals or more (`PDF`, `GitHub`,
 * `useLayoutEffect`), a capital first when the word does not open a sentence (`in Kubernetes`), or a
 * member in code (`fs.watch`, `isCodeMember`). A text written mostly in capitals names nothing this way.
 */
export function namesIn(text: string): string[] {
  const all = [...text.matchAll(WORD)];
  const shouted = all.filter(([word]) => /\p{L}/u.test(word) && word === word.toUpperCase()).length;
  if (shouted * 2 > all.length) return [];
  const names: string[] = [];
  for (const match of all) {
    const word = match[0];
    const capitals = word.match(/\p{Lu}/gu)?.length ?? 0;
    const member = isCodeMember(word);
    if ((capitals === 0 && !member) || NOT_NAMES.has(word)) continue;
    // A URL, an address or a path (`git@github.com:me/mylib.git`) is the asker's own value, not a subject the documents name.
    if (inLocation(text, match.index)) continue;
    const opens = /(?:^|[.?!:;]\s*)$/u.test(text.slice(0, match.index));
    if ((member || capitals >= 2 || (!opens && /^\p{Lu}/u.test(word))) && !names.includes(word)) names.push(word);
    if (names.length === MAX_NAMES) break;
  }
  return names;
}

/** Whether the run of text without spaces around `at` is a URL (`https://…`), an address (`git@host:…`, `me@mail.org`) or a path from a root (`/usr/…`, `./src/…`, `~/…`). */
function inLocation(text: string, at: number): boolean {
  const run = (/\S*$/u.exec(text.slice(0, at))![0] + /^\S*/u.exec(text.slice(at))![0]).replace(/^[("'`<[]+/, '');
  return /:\/\/|\p{L}@[\p{L}\p{N}]/u.test(run) || /^(?:\.{0,2}|~)\/[\p{L}\p{N}._-]/u.test(run);
}

/** A name folded to compare with a corpus's words: lower case, its joins dropped (`coffee-script`, `CoffeeScript`: `coffeescript`). */
export function foldName(word: string): string {
  return word
    .toLowerCase()
    .normalize('NFKD')
    .replace(/[^\p{L}\p{N}]/gu, '');
}

/** The words of a text that join parts (`coffee-script`, `Node.js`), folded: a name may be written either way. */
export function joinedWords(text: string): string[] {
  const found: string[] = [];
  for (const [word] of text.matchAll(WORD)) if (/[.+#-]/.test(word)) found.push(foldName(word));
  return found;
}
