import { Observable, type Subscriber, type Subscription } from 'rxjs';
import { swapLink } from '../flow/demand.js';
import { AbortedError } from '../core/errors.js';

/** How a flight ended. `cancelled`: every participant left before the end, and the work was aborted. */
export type FlightOutcome<T> =
  | { readonly kind: 'complete'; readonly items: readonly T[] }
  | { readonly kind: 'error'; readonly error: unknown }
  | { readonly kind: 'cancelled' };

/** Starts the shared work. `signal` fires only when every participant has left. */
export type FlightWork<T> = (signal: AbortSignal) => Observable<T>;

type State = 'idle' | 'running' | 'complete' | 'error' | 'cancelled';

/**
 * One piece of work shared by every subscriber of {@link Flight.output}: the first
 * subscriber starts it, later ones first receive every item produced so far, then
 * the live ones. The work runs until it ends or the last participant leaves; only
 * then does its signal fire. It runs at its own pace, unpaced by any one
 * participant's demand (a slow participant must not stall the others): the items
 * are held anyway, for late joiners and for the cache.
 *
 * ## Example
 * ```ts
 * const flight = new Flight((signal) => llm.stream(prompt, { signal }), (outcome) => log(outcome.kind));
 * flight.output.subscribe(a);
 * flight.output.subscribe(b);  // b gets the tokens a already got, then the rest with a
 * ```
 */
export class Flight<T> {
  /** Subscribe to take part; unsubscribe to leave. */
  readonly output: Observable<T>;
  private readonly items: T[] = [];
  private readonly participants = new Set<Subscriber<T>>();
  private readonly controller = new AbortController();
  private source: Subscription | undefined;
  private state: State = 'idle';
  private error: unknown;

  constructor(
    private readonly work: FlightWork<T>,
    private readonly onEnd: (outcome: FlightOutcome<T>) => void = () => {},
  ) {
    this.output = new Observable<T>((subscriber) => this.join(subscriber));
  }

  /** Participants now. */
  get participantCount(): number {
    return this.participants.size;
  }

  /** Whether the work has been started and has not ended. */
  get running(): boolean {
    return this.state === 'running';
  }

  private join(subscriber: Subscriber<T>): () => void {
    for (let i = 0; i < this.items.length && !subscriber.closed; i++) subscriber.next(this.items[i]!);
    switch (this.state) {
      case 'complete':
        subscriber.complete();
        return () => {};
      case 'error':
        subscriber.error(this.error);
        return () => {};
      case 'cancelled':
        subscriber.error(new AbortedError(undefined, 'this shared inference was cancelled by all its requesters'));
        return () => {};
    }
    this.participants.add(subscriber);
    if (this.state === 'idle') this.start();
    return () => this.leave(subscriber);
  }

  private start(): void {
    this.state = 'running';
    // The shared work must not be paced by the demand of whichever participant started it.
    const scope = swapLink(undefined);
    try {
      const subscription = this.work(this.controller.signal).subscribe({
        next: (item) => {
          if (this.state !== 'running') return;
          this.items.push(item);
          // A snapshot: a participant joining during this loop has already replayed `item`.
          for (const participant of [...this.participants]) participant.next(item);
        },
        error: (error: unknown) => this.end({ kind: 'error', error }),
        complete: () => this.end({ kind: 'complete', items: this.items }),
      });
      if (this.state === 'running') this.source = subscription;
      else subscription.unsubscribe();
    } catch (error) {
      this.end({ kind: 'error', error });
    } finally {
      if (scope !== undefined) swapLink(scope);
    }
  }

  private leave(subscriber: Subscriber<T>): void {
    if (!this.participants.delete(subscriber) || this.participants.size > 0 || this.state !== 'running') return;
    this.state = 'cancelled';
    this.controller.abort(new AbortedError(undefined, 'every request sharing this inference was cancelled'));
    this.source?.unsubscribe();
    this.source = undefined;
    this.onEnd({ kind: 'cancelled' });
  }

  private end(outcome: FlightOutcome<T>): void {
    if (this.state !== 'running') return;
    this.state = outcome.kind;
    if (outcome.kind === 'error') this.error = outcome.error;
    this.source = undefined;
    // Told first, so a cache is filled (and the flight forgotten) before any participant reacts.
    this.onEnd(outcome);
    const participants = [...this.participants];
    this.participants.clear();
    for (const participant of participants) {
      if (outcome.kind === 'error') participant.error(outcome.error);
      else participant.complete();
    }
  }
}

/**
 * Single-flight: concurrent requests with the same key share one flight of work.
 * The first request's subscription starts the work; requests arriving while it runs
 * join it (late joiners get every item from the start); when it ends — completes,
 * fails, or is cancelled by all its participants — it is forgotten, and the next
 * request with that key starts afresh. Errors reach every participant.
 *
 * ## Example
 * ```ts
 * const flights = new SingleFlight<string>();
 * const tokens = (prompt: string) => flights.join(cacheKey({ model, prompt }), (signal) => llm.stream(prompt, { signal }));
 * merge(tokens('Hi'), tokens('Hi')).subscribe(print); // one inference, every token twice
 * ```
 */
export class SingleFlight<T> {
  private readonly flights = new Map<string, Flight<T>>();

  /** Flights running now. */
  get size(): number {
    return this.flights.size;
  }

  /** Whether a flight for `key` is running. */
  has(key: string): boolean {
    return this.flights.has(key);
  }

  /**
   * An Observable that, when subscribed, joins the flight running for `key` (and
   * calls `hooks.onJoin`) or starts one running `work`. `hooks.onEnd` hears how a
   * flight this subscription started ended, before its participants do.
   */
  join(key: string, work: FlightWork<T>, hooks: { onJoin?: () => void; onEnd?: (outcome: FlightOutcome<T>) => void } = {}): Observable<T> {
    return new Observable<T>((subscriber) => {
      let flight = this.flights.get(key);
      if (flight !== undefined) {
        hooks.onJoin?.();
      } else {
        const started: Flight<T> = new Flight(work, (outcome) => {
          if (this.flights.get(key) === started) this.flights.delete(key);
          hooks.onEnd?.(outcome);
        });
        flight = started;
        this.flights.set(key, started);
      }
      return flight.output.subscribe(subscriber);
    });
  }
}
