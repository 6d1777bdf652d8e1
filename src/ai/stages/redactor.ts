import { parseOptions } from '../../flow/options.js';
import { type Detector, detectorsOf, type RedactPattern } from './pii-detectors.js';
import { type RedactOptions, redactorOptionsSchema } from './redact-options.js';

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
    this.detectors = detectorsOf({ ...parsed, patterns: parsed.patterns as RedactPattern[] | undefined });
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
