import type { InspectedRun, RunDescription } from '../../flow/introspection.js';
import type * as z from 'zod';
import { lazySchema, zod } from '../../core/zod.js';
import { asyncScheduler, type Observable, type SchedulerLike } from 'rxjs';
import { Flow, type Outlet } from '../../flow/demand.js';
import { Inlet } from '../../flow/inlet.js';
import { LinkedRun } from '../../flow/linked-run.js';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../../flow/options.js';
import { Ring } from '../../flow/ring.js';
import { StageStats } from '../../flow/stats.js';
import { StageError, UnpausableSourceError } from '../../core/errors.js';
import { TraceContext, Traced } from '../../core/trace.js';

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

/**
 * Counters of a `redact` operator: `received` counts tokens in, `emitted` chunks out,
 * `delivered` tokens taken in (their text goes out now, with a later chunk, or at
 * completion). Held text that an error or an unsubscribe drops is counted in
 * `dropped` (characters): it was never let out, so nothing unredacted leaked.
 */
export class RedactStats extends StageStats {
  /** Matches replaced, per kind (`email`, `card`, a pattern's `name`...). */
  readonly redacted: Record<string, number> = {};
  /** Times `maxHold` forced out text that could still have been the start of a match. */
  forced = 0;
  /** Held characters dropped by an upstream error or an unsubscribe. */
  dropped = 0;
}

/** Options of `redact`: the kinds of PII to detect, extra patterns, the replacements and how long a possible match is held. */
export interface RedactOptions {
  /** Names the operator in errors, trace notes and stats. Default `redact`. */
  name?: string;
  /** Built-in detectors to run. Default all: `['card', 'ip', 'email', 'phone']`. */
  detect?: readonly PiiKind[];
  /** Replacement text per built-in kind, e.g. `{ email: '<email>' }`. */
  replacements?: Partial<Record<PiiKind, string>>;
  /** Extra patterns, tried after the built-ins. */
  patterns?: readonly RedactPattern[];
  /**
   * Characters that may be held back at most (default 1024). The built-in detectors
   * never need more than about 600; past the bound the oldest held text is redacted
   * as if the stream ended there and let out (`stats.forced`), so a pathological stream
   * cannot grow memory.
   */
  maxHold?: number;
  /**
   * `trace` (default): an element whose trace differs from the held text's starts a new
   * response, so the held text is flushed first and no match spans two responses.
   * `none`: the whole subscription is one text.
   */
  boundary?: 'trace' | 'none';
  /** Redacted chunks waiting for downstream demand before no more demand goes upstream. Default 1. */
  capacity?: number;
  /** Timers of the demand link. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
  /** Counters shared by every subscription. */
  stats?: RedactStats;
}

/** The operator `redact` returns: text chunks (plain or traced) in, a Flow of traced redacted chunks out. */
export type RedactOperator = (source: Observable<string | Traced<string>>) => Flow<Traced<string>>;

// ---- the detectors ----

interface Detector {
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

/** Raw characters kept before the held text, so lookbehinds see what was already let out. */
const CONTEXT = 32;

interface Found {
  start: number;
  end: number;
}

function nextMatch(detector: Detector, text: string, from: number): Found | undefined {
  const re = detector.match;
  re.lastIndex = from;
  for (;;) {
    const m = re.exec(text);
    if (m === null) return undefined;
    const start = m.index;
    const end = start + (detector.accept === undefined ? m[0].length : detector.accept(m[0]));
    if (end > start) return { start, end };
    // A rejected or empty match leaves its position to the other detectors.
    re.lastIndex = start + 1;
  }
}

/** The leftmost position ≥ `from` where a match could start whose outcome depends on text not seen yet. */
function horizon(detector: Detector, text: string, from: number): number {
  if (detector.partial === undefined) return Math.max(from, text.length - detector.maxLength);
  const re = detector.partial;
  re.lastIndex = from;
  const m = re.exec(text);
  return m === null ? text.length : m.index;
}

/**
 * The redaction of `text[from..]`. At every position the leftmost match wins, then
 * the longest, then the earlier detector; scanning goes on after it. Unless `final`,
 * it stops at the first position where a match could still start or change with more
 * text and returns that position as `stop`.
 */
function scan(detectors: readonly Detector[], text: string, from: number, final: boolean, counts: Record<string, number>): { out: string; stop: number } {
  const n = detectors.length;
  const found: (Found | undefined | null)[] = new Array(n).fill(null); // null: not searched from the current position
  const horizons: number[] = new Array(n).fill(text.length);
  let limit = text.length;
  let pos = from;
  let out = '';
  const refresh = (): void => {
    limit = text.length;
    for (let i = 0; i < n; i++) {
      if (!final && horizons[i]! < pos) horizons[i] = horizon(detectors[i]!, text, pos);
      if (horizons[i]! < limit) limit = horizons[i]!;
    }
  };
  if (!final) {
    for (let i = 0; i < n; i++) horizons[i] = horizon(detectors[i]!, text, pos);
    refresh();
  }
  for (;;) {
    let best = -1;
    let bestMatch: Found | undefined;
    for (let i = 0; i < n; i++) {
      let m = found[i];
      if (m === null || (m !== undefined && m.start < pos)) found[i] = m = nextMatch(detectors[i]!, text, pos);
      // Invariant: a match starting before every horizon cannot change whatever text comes next.
      if (m === undefined || (!final && m.start >= limit)) continue;
      if (bestMatch === undefined || m.start < bestMatch.start || (m.start === bestMatch.start && m.end > bestMatch.end)) {
        best = i;
        bestMatch = m;
      }
    }
    if (bestMatch === undefined) {
      const stop = final ? text.length : limit;
      return { out: out + text.slice(pos, stop), stop };
    }
    const detector = detectors[best]!;
    out += text.slice(pos, bestMatch.start) + detector.replacement;
    counts[detector.kind] = (counts[detector.kind] ?? 0) + 1;
    pos = bestMatch.end;
    if (!final && pos > limit) refresh();
  }
}

/**
 * The incremental redactor behind `redact`, usable on its own: `push` returns the
 * redacted text that no later text can change, `flush` the rest.
 *
 * For any text and any split of it into pushes, the concatenation of the results
 * (and a final `flush`) equals `redactText(text)`, as long as `maxHold` never forces
 * text out (the built-in detectors never hold more than about 600 characters).
 */
export class Redactor {
  private readonly detectors: readonly Detector[];
  private readonly maxHold: number;
  private held = '';
  private context = '';
  /** Matches replaced since the last `takeCounts`, per kind. */
  private counts: Record<string, number> = {};
  /** Times `maxHold` forced text out. */
  forced = 0;

  constructor(options: Pick<RedactOptions, 'detect' | 'replacements' | 'patterns' | 'maxHold'> = {}) {
    const parsed = parseOptions(redactorOptionsSchema(), options, 'redactor options');
    this.detectors = detectorsOf(parsed);
    this.maxHold = parsed.maxHold;
  }

  /** Characters held back now: a tail that could still be the start of a match. */
  get holding(): number {
    return this.held.length;
  }

  /** Takes the next chunk of a stream and returns what can be released redacted; a match that may continue is held back. */
  push(chunk: string): string {
    const text = this.context + this.held + chunk;
    const { out, stop } = scan(this.detectors, text, this.context.length, false, this.counts);
    this.keep(text, stop);
    if (this.held.length <= this.maxHold) return out;
    this.forced++;
    // The oldest part goes out as if the stream ended there: a match straddling the cut is missed, memory stays bounded.
    const cut = this.context.length + this.held.length - this.maxHold;
    const forcedText = this.context + this.held;
    const head = scan(this.detectors, forcedText.slice(0, cut), this.context.length, true, this.counts);
    this.keep(forcedText, cut);
    return out + head.out;
  }

  /** Releases what was held back, redacted: call it at the end of the stream. */
  flush(): string {
    if (this.held.length === 0) return '';
    const text = this.context + this.held;
    const { out } = scan(this.detectors, text, this.context.length, true, this.counts);
    this.keep(text, text.length);
    return out;
  }

  /** Matches replaced since the last call, per kind; resets them. */
  takeCounts(): Record<string, number> {
    const counts = this.counts;
    this.counts = {};
    return counts;
  }

  private keep(text: string, stop: number): void {
    this.held = text.slice(stop);
    this.context = text.slice(Math.max(0, stop - CONTEXT), stop);
  }
}

/**
 * Redacts a whole text at once: what `redact` produces for a stream whose chunks
 * concatenate to `text`.
 *
 * ## Example
 * ```ts
 * redactText('mail jo@example.com or call 555-123-4567'); // 'mail [EMAIL] or call [PHONE]'
 * ```
 */
export function redactText(text: string, options: Pick<RedactOptions, 'detect' | 'replacements' | 'patterns'> = {}): string {
  const redactor = new Redactor({ ...options, maxHold: Math.max(1, text.length) });
  return redactor.push(text) + redactor.flush();
}

// ---- options ----

const patternSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }),
      pattern: z.instanceof(RegExp, { error: 'pattern must be a RegExp' }),
      replacement: z.string().optional(),
      maxLength: positiveInt('maxLength').optional(),
      partial: z.instanceof(RegExp, { error: 'partial must be a RegExp' }).optional(),
      validate: functionSchema<(match: string) => boolean>().optional(),
    })
    .strict()
    .refine((p) => p.partial === undefined || p.partial.source.endsWith('$'), {
      error: 'partial must end with $ (it matches the tail of the text)',
      path: ['partial'],
    }),
);

const redactorFields = () => {
  const z = zod();
  return {
    detect: z.array(z.enum(PII_KINDS, { error: `detect entries must be one of ${PII_KINDS.map((k) => `"${k}"`).join(', ')}` })).optional(),
    replacements: z.partialRecord(z.enum(PII_KINDS), z.string()).optional(),
    patterns: z.array(patternSchema()).optional(),
    maxHold: positiveInt('maxHold').default(1024),
  };
};

const redactorOptionsSchema = lazySchema((z) => z.object(redactorFields()).strict());

const redactOptionsSchema = lazySchema((z) =>
  z
    .object({
      ...redactorFields(),
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      boundary: z.enum(['trace', 'none'], { error: 'boundary must be "trace" or "none"' }).default('trace'),
      capacity: positiveInt('capacity').default(1),
      scheduler: schedulerSchema().optional(),
      stats: z.instanceof(RedactStats, { error: 'stats must be a RedactStats' }).optional(),
    })
    .strict(),
);

function detectorsOf(options: z.output<ReturnType<typeof redactorOptionsSchema>>): Detector[] {
  const kinds = options.detect ?? PII_KINDS;
  const detectors = PII_KINDS.filter((k) => kinds.includes(k)).map((k) => detectorFor(k, options.replacements?.[k] ?? DEFAULT_REPLACEMENTS[k]));
  for (const pattern of options.patterns ?? []) detectors.push(userDetector(pattern as RedactPattern));
  return detectors;
}

// ---- the operator ----

/**
 * Redacts personal data from a stream of text chunks (LLM tokens): e-mail addresses,
 * phone numbers, card numbers that pass the Luhn check, IPv4 and IPv6 addresses, and
 * your own patterns, each replaced by `[EMAIL]`, `[PHONE]`, `[CARD]`, `[IP]`, `[NAME]`.
 *
 * ```
 * source:  -a----b-------c---|         a = 'mail jo', b = 'hn@exa', c = 'mple.com now'
 * redact()
 * output:  -x------------y---(z|)      x = 'mail ', y = '[EMAIL] ', z = 'now' (a last word could still start an address)
 * ```
 *
 * A match split across chunks is still found. Only the tail that could still be the
 * start of a match is held back (`'john@exa'` waits for its domain; `'Hello, '` goes out
 * at once); everything before it is emitted with the chunk that made it certain. The
 * hold is bounded by `maxHold`; on completion the held text is redacted and flushed.
 * For any text and any split into chunks, the concatenated output equals
 * `redactText(text)` (while `maxHold` is not reached).
 *
 * Each output chunk carries the trace of the input chunk that let it out. Per
 * response (trace), the running count of each kind is noted in the trace as
 * `"<name>.<kind>"` (e.g. `"redact.email": 2`), and summed per kind in
 * `stats.redacted`. With `boundary: 'trace'` (default) a chunk with another trace
 * flushes the held text first: responses are redacted separately. To redact
 * interleaved responses (`ordered: false` stages), apply `redact()` to each
 * response's own token stream inside the stage, as in the example.
 *
 * Demand: at most `capacity` chunks wait for downstream (one more when a response
 * boundary flushes); upstream is asked for more only below that. One `Redactor` per
 * subscription. Upstream error errors at once and drops the held text; unsubscribing
 * drops it too (`stats.dropped` counts the characters).
 *
 * ## Example
 * ```ts
 * prompts.pipe(
 *   stage((prompt: string, { signal }) => model.stream(prompt, { signal }).pipe(redact({ name: 'pii' })), { name: 'infer' }),
 * ).subscribe(({ value }) => process.stdout.write(value));   // never prints a whole e-mail or valid card number
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see redactText; Redactor; luhnValid.
 */
export function redact(options: RedactOptions = {}): RedactOperator {
  const parsed = parseOptions(redactOptionsSchema(), options, `redact${options?.name ? ` "${options.name}"` : ''} options`);
  const config: RedactConfig = {
    name: parsed.name ?? 'redact',
    redactor: { detect: parsed.detect, replacements: parsed.replacements, patterns: parsed.patterns as RedactPattern[] | undefined, maxHold: parsed.maxHold },
    byTrace: parsed.boundary === 'trace',
    capacity: parsed.capacity,
    scheduler: parsed.scheduler ?? asyncScheduler,
  };
  const stats = parsed.stats ?? new RedactStats();
  return (source) => new Flow<Traced<string>>((outlet) => new RedactRun(source, config, stats, outlet));
}

interface RedactConfig {
  readonly name: string;
  readonly redactor: Pick<RedactOptions, 'detect' | 'replacements' | 'patterns' | 'maxHold'>;
  readonly byTrace: boolean;
  readonly capacity: number;
  readonly scheduler: SchedulerLike;
}

/** One subscription: its own `Redactor` and the chunks waiting for demand. */
class RedactRun extends LinkedRun<string | Traced<string>> implements InspectedRun {
  protected readonly inlet: Inlet;
  private readonly queue = new Ring<Traced<string>>(2);
  private readonly redactor: Redactor;
  /** The response the held text belongs to, and its running counts per kind. */
  private trace: TraceContext | undefined;
  private traceCounts: Record<string, number> = {};
  private noted = 0;
  private seq = 0;

  constructor(
    protected readonly source: Observable<string | Traced<string>>,
    private readonly config: RedactConfig,
    readonly stats: RedactStats,
    protected readonly outlet: Outlet<Traced<string>>,
  ) {
    super();
    this.inlet = new Inlet(this, { scheduler: config.scheduler });
    this.redactor = new Redactor(config.redactor);
  }

  describe(): RunDescription {
    return { name: this.config.name, kind: 'redact', capacity: this.config.capacity, concurrency: 1, policy: 'pause' };
  }

  demandNow(): number {
    return this.outlet.demand();
  }

  ownLink(): Inlet {
    return this.inlet;
  }

  room(): number {
    if (this.terminated || this.upstreamDone) return 0;
    return this.config.capacity - this.queue.length;
  }

  onNext(input: string | Traced<string>): void {
    if (this.terminated || this.upstreamDone) return;
    const asked = this.inlet.arrive();
    this.stats.receivedCount++;
    const seq = this.seq++;
    const text: unknown = input instanceof Traced ? input.value : input;
    if (typeof text !== 'string') {
      this.stats.failed++;
      this.fail(new StageError(this.config.name, seq, new TypeError(`redact expects text chunks, got ${typeof text}`)));
      return;
    }
    if (this.queue.length >= this.config.capacity && !asked) {
      this.stats.failed++;
      this.fail(new UnpausableSourceError(this.config.name, this.config.capacity));
      return;
    }
    // Plain chunks are one response: they share one trace for the whole subscription.
    const trace = input instanceof Traced ? input.trace : (this.trace ?? new TraceContext(seq, false));
    if (this.trace !== trace) {
      if (this.trace !== undefined && this.config.byTrace) this.endResponse();
      this.trace = trace;
    }
    const before = this.redactor.forced;
    const out = this.redactor.push(text);
    if (this.redactor.forced !== before) this.stats.forced++;
    this.stats.deliveredCount++;
    this.enqueue(out, trace);
    this.drain();
  }

  override onUpstreamComplete(): void {
    if (this.terminated || this.upstreamDone) return;
    this.upstreamDone = true;
    this.upstream?.unsubscribe();
    if (this.trace !== undefined) this.endResponse();
    this.drain();
  }

  onUpstreamError(err: unknown): void {
    this.fail(err);
  }

  private endResponse(): void {
    this.enqueue(this.redactor.flush(), this.trace!);
    this.traceCounts = {};
  }

  /** Notes the counts on the chunk's trace even when all its text is held: the trace is the response's. */
  private enqueue(out: string, trace: TraceContext): void {
    const counts = this.redactor.takeCounts();
    for (const kind in counts) {
      const n = counts[kind]!;
      this.traceCounts[kind] = (this.traceCounts[kind] ?? 0) + n;
      this.stats.redacted[kind] = (this.stats.redacted[kind] ?? 0) + n;
      trace.note(this.config.name, kind, this.traceCounts[kind]!);
    }
    if (this.redactor.forced !== this.noted) {
      this.noted = this.redactor.forced;
      trace.note(this.config.name, 'forced', this.noted);
    }
    if (out.length === 0) return;
    this.queue.push(new Traced(out, trace));
    this.stats.buffered++;
  }

  protected deliver(): void {
    while (!this.terminated && this.queue.length > 0 && this.outlet.wants()) {
      this.stats.buffered--;
      this.stats.emittedCount++;
      this.outlet.next(this.queue.shift()!);
    }
  }

  protected holding(): boolean {
    return this.queue.length > 0;
  }

  /** Documented choice: an error ends the stream at once; held text is dropped (never let out unredacted). */
  private fail(error: unknown): void {
    if (this.terminated) return;
    this.terminated = true;
    this.release();
    this.outlet.error(error);
  }

  protected release(): void {
    this.stats.buffered -= this.queue.length;
    this.queue.drain();
    this.stats.dropped += this.redactor.holding;
    this.upstream?.unsubscribe();
    this.inlet.close();
  }
}
