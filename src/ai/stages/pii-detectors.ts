/**
 * The detectors `redact` runs: the built-in kinds (card, ip, email, phone) and users'
 * patterns, each a global regex for matches and one for the tail that more text could
 * still turn into a match.
 */

/** The built-in detectors. `ip` covers IPv4 and IPv6. */
export const PII_KINDS = ['card', 'ip', 'email', 'phone'] as const;
/** A kind of personal data `redact` finds (one of `PII_KINDS`). */
export type PiiKind = (typeof PII_KINDS)[number];

/** What each built-in kind is replaced with unless `replacements` says otherwise. */
export const DEFAULT_REPLACEMENTS: Readonly<Record<PiiKind, string>> = { card: '[CARD]', ip: '[IP]', email: '[EMAIL]', phone: '[PHONE]' };

/** A user-supplied pattern. */
export interface RedactPattern {
  /** The kind the pattern counts under in stats and trace notes. */
  name: string;
  /** What to find. Flags are kept except `g`/`y` (added and removed as the scanner needs); lookbehind may reach back at most 32 characters. */
  pattern: RegExp;
  /** Default `[NAME]` (the name upper-cased). */
  replacement?: string;
  /**
   * Longest text a match can span, in characters (default 64). Without `partial`, the
   * last `maxLength` characters are held back, because nothing else says whether they
   * start a match.
   */
  maxLength?: number;
  /**
   * Matches, ending at `$`, every text that more characters could still turn into a
   * match (or lengthen one), e.g. `/(?<![A-Z])[A-Z]{0,3}-?\d{0,6}$/` for `/(?<![A-Z])[A-Z]{3}-\d{6}/`.
   * With it only such a tail is held back; it must accept *every* such prefix, or a
   * match split across tokens can be missed.
   */
  partial?: RegExp;
  /** Rejects candidate matches (as the Luhn check does for cards): a rejected match is left as it is. */
  validate?: (match: string) => boolean;
}

export interface Detector {
  readonly kind: string;
  readonly replacement: string;
  /** Global: the leftmost match at or after `lastIndex`. */
  readonly match: RegExp;
  /** Global, ends at `$`: the leftmost position from which more text could complete or change a match. */
  readonly partial: RegExp | undefined;
  /** Used when there is no `partial`: matches are at most this long. */
  readonly maxLength: number;
  /** How much of a candidate is a match: its length, or 0 to reject it. Absent: all of it. */
  readonly accept: ((candidate: string) => number) | undefined;
}

/**
 * Regex source of every prefix of the concatenation of `parts`, each given as
 * `[full, prefixes]` (`prefixes` must accept every prefix of `full`, the empty one and
 * `full` itself included): prefixes(AB) = prefixes(A) | A·prefixes(B).
 */
function prefixesOf(parts: readonly (readonly [full: string, prefixes: string])[]): string {
  let out = '';
  for (let i = parts.length - 1; i >= 0; i--) {
    const [full, prefixes] = parts[i]!;
    out = out === '' ? prefixes : `(?:${prefixes}|${full}${out})`;
  }
  return out;
}

/** A detector from its parts; the last part stands for what the trailing lookahead reads, so text ending there stays open too. */
function builtIn(
  kind: PiiKind,
  replacement: string,
  before: string,
  alternatives: readonly (readonly (readonly [string, string])[])[],
  after: string,
  accept?: (candidate: string) => number,
): Detector {
  const full = alternatives.map((parts) => parts.map(([f]) => f).join('')).join('|');
  const partial = alternatives.map((parts) => prefixesOf(parts)).join('|');
  return {
    kind,
    replacement,
    match: new RegExp(`${before}(?:${full})${after}`, 'g'),
    partial: new RegExp(`${before}(?:${partial})$`, 'g'),
    maxLength: Infinity,
    accept,
  };
}

/** Luhn checksum over the digits of `candidate`, which must hold 13 to 19 of them. */
export function luhnValid(candidate: string): boolean {
  let sum = 0;
  let digits = 0;
  for (let i = candidate.length - 1; i >= 0; i--) {
    const digit = candidate.charCodeAt(i) - 48;
    if (digit < 0 || digit > 9) continue;
    // Every second digit from the right is doubled; 9 subtracted folds a two-digit product.
    sum += digits % 2 === 1 ? (digit * 2 > 9 ? digit * 2 - 9 : digit * 2) : digit;
    digits++;
  }
  return digits >= 13 && digits <= 19 && sum % 10 === 0;
}

const isDigit = (code: number): boolean => code >= 48 && code <= 57;

/**
 * The longest prefix of a digit run that is a card number: it ends where no digit
 * follows, holds 13–19 digits and passes Luhn; 0 when there is none. Shorter prefixes
 * count because two numbers one space apart form one run, and neither may leak.
 */
function acceptCard(candidate: string): number {
  let best = 0;
  let digits = 0;
  for (let i = 0; i < candidate.length; i++) {
    if (!isDigit(candidate.charCodeAt(i))) continue;
    digits++;
    if (digits > 19) break;
    const boundary = i + 1 === candidate.length || !isDigit(candidate.charCodeAt(i + 1));
    if (digits >= 13 && boundary && luhnValid(candidate.slice(0, i + 1))) best = i + 1;
  }
  return best;
}

function digitCount(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) >= 48 && text.charCodeAt(i) <= 57) n++;
  return n;
}

const OCTET = '(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)';
const H16 = '[0-9A-Fa-f]{1,4}';

function detectorFor(kind: PiiKind, replacement: string): Detector {
  switch (kind) {
    case 'card':
      // A card is 13–19 digits, optionally grouped by single spaces or hyphens, not inside a longer number, passing Luhn.
      return builtIn(
        kind,
        replacement,
        '(?<!\\d)',
        [
          [
            ['\\d', '\\d?'],
            ['(?:[ -]?\\d){12,18}', '(?:[ -]?\\d){0,18}[ -]?'],
          ],
        ],
        '(?!\\d)',
        acceptCard,
      );
    case 'email':
      return builtIn(
        kind,
        replacement,
        '(?<![A-Za-z0-9._%+-])',
        [
          [
            ['[A-Za-z0-9._%+-]{1,64}', '[A-Za-z0-9._%+-]{0,64}'],
            ['@', '@?'],
            ['(?:[A-Za-z0-9-]{1,63}\\.){1,8}[A-Za-z]{2,24}', '[A-Za-z0-9.-]{0,540}'],
          ],
        ],
        '(?![A-Za-z0-9-])',
      );
    case 'phone':
      return builtIn(
        kind,
        replacement,
        '(?<![\\w+])',
        [
          // North American: (555) 123-4567, 555.123.4567, 1-555-123-4567.
          [
            ['(?:1[ .-])?', '(?:1[ .-]?)?'],
            ['(?:\\(\\d{3}\\) ?|\\d{3}[ .-])', '(?:\\(\\d{0,3}|\\(\\d{3}\\) ?|\\d{0,3}|\\d{3}[ .-])'],
            ['\\d{3}[ .-]', '(?:\\d{0,3}|\\d{3}[ .-])'],
            ['\\d{4}', '\\d{0,4}'],
            ['', '[.-]?'],
          ],
          // International: +44 20 7946 0958, +1-555-123-4567, +49 (30) 1234567.
          [
            ['\\+', '\\+?'],
            ['\\d{1,3}', '\\d{0,3}'],
            ['[ .-]?', '[ .-]?'],
            ['(?:\\(\\d{1,4}\\)[ .-]?)?', '(?:\\(\\d{0,4}|\\(\\d{1,4}\\)[ .-]?)?'],
            ['\\d{1,4}', '\\d{0,4}'],
            ['(?:[ .-]?\\d{1,4}){1,4}', '(?:[ .-]?\\d{1,4}){0,4}[ .-]?'],
            ['', '[.-]?'],
          ],
        ],
        '(?!\\w|[.-]\\d)',
        // A number a phone system can dial has 7 to 15 digits (E.164).
        (match) => {
          const digits = digitCount(match);
          return digits >= 7 && digits <= 15 ? match.length : 0;
        },
      );
    case 'ip': {
      const v4: readonly (readonly [string, string])[] = [
        [OCTET, '\\d{0,3}'],
        [`(?:\\.${OCTET}){3}`, '(?:\\.\\d{1,3}){0,3}\\.?'],
        ['', '\\.?'],
      ];
      // IPv6, fully written or with one `::` (not the IPv4-mapped form); hex groups are at most 4 digits.
      const v6full = `(?:${H16}:){7}${H16}`;
      const v6compressed = `(?:(?:${H16}:){0,6}${H16})?::(?:(?:${H16}:){0,6}${H16})?`;
      const v6: readonly (readonly [string, string])[] = [
        [`(?:${v6full}|${v6compressed})`, '[0-9A-Fa-f:]{0,39}'],
        ['', '\\.?'],
      ];
      const detector = builtIn(kind, replacement, '(?<![\\w.:])', [v4, v6], '(?![\\w:]|\\.\\d)', (match) => {
        if (!match.includes(':')) return match.length;
        // A compressed form stands for 8 groups: it must leave at least one out, and a bare `::` is punctuation, not an address.
        const groups = match.split(':').filter((g) => g !== '').length;
        const valid = match.includes('::') ? groups >= 1 && groups <= 7 && match.indexOf('::') === match.lastIndexOf('::') : groups === 8;
        return valid ? match.length : 0;
      });
      return detector;
    }
  }
}

function userDetector(pattern: RedactPattern): Detector {
  const validate = pattern.validate;
  const flags = pattern.pattern.flags.replace(/[gy]/g, '');
  return {
    kind: pattern.name,
    replacement: pattern.replacement ?? `[${pattern.name.toUpperCase()}]`,
    match: new RegExp(pattern.pattern.source, `${flags}g`),
    partial: pattern.partial === undefined ? undefined : new RegExp(pattern.partial.source, `${pattern.partial.flags.replace(/[gy]/g, '')}g`),
    maxLength: pattern.maxLength ?? 64,
    accept: validate === undefined ? undefined : (match) => (validate(match) ? match.length : 0),
  };
}

/** The detectors for `detect` (default: every built-in kind, in `PII_KINDS` order), then one per pattern. */
export function detectorsOf(options: {
  readonly detect?: readonly PiiKind[] | undefined;
  readonly replacements?: Partial<Record<PiiKind, string>> | undefined;
  readonly patterns?: readonly RedactPattern[] | undefined;
}): Detector[] {
  const kinds = options.detect ?? PII_KINDS;
  const detectors = PII_KINDS.filter((k) => kinds.includes(k)).map((k) => detectorFor(k, options.replacements?.[k] ?? DEFAULT_REPLACEMENTS[k]));
  for (const pattern of options.patterns ?? []) detectors.push(userDetector(pattern));
  return detectors;
}
