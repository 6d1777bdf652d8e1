import type { InspectedRun, RunDescription } from '../../flow/introspection.js';
import { asyncScheduler, type Observable, type SchedulerLike } from 'rxjs';
import { Flow, type Outlet } from '../../flow/demand.js';
import { Inlet } from '../../flow/inlet.js';
import { LinkedRun } from '../../flow/linked-run.js';
import { parseOptions } from '../../flow/options.js';
import { Ring } from '../../flow/ring.js';
import { StageError, UnpausableSourceError } from '../../core/errors.js';
import { TraceContext, Traced } from '../../core/trace.js';
import type { RedactPattern } from './pii-detectors.js';
import { type RedactOptions, RedactStats, redactOptionsSchema } from './redact-options.js';
import { Redactor } from './redactor.js';

/** The operator `redact` returns: text chunks (plain or traced) in, a Flow of traced redacted chunks out. */
export type RedactOperator = (source: Observable<string | Traced<string>>) => Flow<Traced<string>>;

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
