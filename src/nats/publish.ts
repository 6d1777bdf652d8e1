/**
 * The producing end of a link: a sink that takes elements from upstream only while the link has
 * room, and publishes each once (a `msgID` of producer id and sequence lets the server drop a
 * retried duplicate).
 *
 * Credit: room = capacity − the stream's backlog at the last look − this producer's messages that
 * look may not have counted (sent and not confirmed, or confirmed with a sequence past the stream's
 * last at that look). The backlog is read from the server (the stream's message count: a work queue
 * deletes a message when a receiver acknowledges it), so credit cannot be lost for good: it is recomputed when
 * receivers announce freed room on the link's credit subject, and on a timer when none does. A
 * publish the server refuses for the bound (several producers raced for the same room) is kept
 * and sent again once there is room; nothing is dropped.
 */
import type { Observable } from 'rxjs';
import type { MsgHdrs, Subscription as NatsSubscription } from '@nats-io/nats-core';
import { type Settlement, forEachSettlement } from '../core/settlement.js';
import { Traced } from '../core/trace.js';
import { subscribeWithDemand, type DemandLink, type DemandSubscription } from '../flow/demand.js';
import { activeIntrospector, type InspectedRun, type Introspector, type RunCounters, type RunDescription } from '../flow/introspection.js';
import { StageStats } from '../flow/stats.js';
import { type Link, LinkError, MAXIMUM_MESSAGES_EXCEEDED, apiCode, definite, disconnected, refused } from './link.js';
import { invalidReason, traceHeaders } from './wire.js';
import { agreeOnContract } from './contract.js';
import { sourceIdOf } from './source.js';
import { functionSchema, parseOptions } from '../flow/options.js';
import { lazySchema } from '../core/zod.js';

/** Options of `toLink`. */
export interface ToLinkOptions<T> {
  /** Names this producer in message ids (default: random). Reuse it after a restart to let the server drop what it already has. */
  producerId?: string;
  /**
   * Message ids of elements that came from a link: `'source'` (default) derives them from the
   * source message and the output's ordinal among its outputs, so a worker that redoes a message
   * another worker died on sends the same ids and the server drops the copies (within its
   * duplicate window, 2 minutes by default); `'producer'` numbers them by producer like other
   * elements (two producers sending outputs of one source message into one link need it).
   */
  ids?: 'source' | 'producer';
  /** The message body for an element (default: JSON). */
  encode?: (value: T) => Uint8Array | string;
  /**
   * An element the link's schema refuses: `'fail'` (default) rejects with a `LinkError`
   * `INVALID_MESSAGE` naming the bad fields; `'skip'` counts it in `invalid`, fails its
   * element (a message it came from is dead-lettered) and goes on.
   */
  onInvalid?: 'fail' | 'skip';
}

const toLinkSchema = lazySchema((z) =>
  z.strictObject({
    producerId: z.string({ error: 'producerId must be a string' }).min(1, { error: 'producerId must not be empty' }).optional(),
    ids: z.enum(['source', 'producer'], { error: "ids must be 'source' or 'producer'" }).optional(),
    encode: functionSchema<(value: unknown) => Uint8Array | string>().optional(),
    onInvalid: z.enum(['fail', 'skip'], { error: "onInvalid must be 'fail' or 'skip'" }).optional(),
  }),
);

/** What a finished `toLink` sent. */
export interface PublishSummary {
  /** Elements confirmed stored by the server. */
  readonly published: number;
  /** Of those, the server already had (a retry after a lost confirmation). */
  readonly duplicates: number;
  /** Publishes refused for the bound and sent again. */
  readonly refusals: number;
  /** The largest backlog seen on the server, which `capacity` bounds. */
  readonly peakBacklog: number;
  /** Elements the link's schema refused, under `onInvalid: 'skip'`. */
  readonly invalid: number;
  /** Publishes sent again after a passing failure (no confirmation in time, a server restarting). */
  readonly retries: number;
}

/**
 * Publishes every element of `source` to `link`, pulling from upstream only as the link has room
 * and at most `publishWindow` publishes unconfirmed. A `Traced` element's trace goes in the
 * message headers, and the element counts as delivered (its own link message, if it came from
 * one, is acknowledged) once the server confirmed it. Resolves when the source completed and
 * every publish was confirmed; rejects with the source's error, or a `LinkError` (upstream is
 * cancelled). Bad options throw `InvalidOptionsError` at the call, naming the field.
 */
export function toLink<T>(source: Observable<T | Traced<T>>, link: Link<T>, options: ToLinkOptions<T> = {}): Promise<PublishSummary> {
  parseOptions(toLinkSchema(), options, 'toLink options');
  return new Promise((resolve, reject) => new Publisher(source, link, options, resolve, reject).start());
}

/** The inspector's node of a link's publishers: one per link, as for a stage's `StageStats`. */
const publisherNodes = new WeakMap<object, StageStats>();

class Publisher<T> implements InspectedRun {
  private readonly producerId: string;
  private readonly encode: (value: T) => Uint8Array | string;
  private readonly skipInvalid: boolean;
  private readonly sourceIds: boolean;
  /** Outputs sent so far per source message (`ids: 'source'`). */
  private readonly ordinals = new WeakMap<Settlement, number>();
  private subscription: DemandSubscription | undefined;
  private creditWatch: NatsSubscription | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  /** Elements received and not yet confirmed. */
  private unconfirmed = 0;
  private sequence = 0;
  /** The stream's message count and last sequence at the last look. */
  private backlog = 0;
  private lookedSeq = 0;
  /** This producer's messages the last look may not have counted: they take room it did not see taken. */
  private uncounted = 0;
  /** Sequences confirmed while a look was under way: it counted those at or below the last sequence it saw. */
  private confirmedDuringLook: number[] = [];
  private looking = false;
  /** An element taken while the link had no room: sent once a look finds room. */
  private parked: Outgoing | undefined;
  private sourceDone = false;
  private ended = false;
  private published = 0;
  private duplicates = 0;
  private refusals = 0;
  private peakBacklog = 0;
  private invalid = 0;
  private retries = 0;
  /** The inspector told of this publisher, to tell of its end. */
  private introspector: Introspector | undefined;
  private own: DemandLink | undefined;

  constructor(
    private readonly source: Observable<T | Traced<T>>,
    private readonly link: Link<T>,
    options: ToLinkOptions<T>,
    private readonly resolve: (summary: PublishSummary) => void,
    private readonly reject: (error: unknown) => void,
  ) {
    this.producerId = options.producerId ?? Math.random().toString(36).slice(2, 12);
    this.encode = options.encode ?? ((value: T) => JSON.stringify(value));
    this.skipInvalid = options.onInvalid === 'skip';
    this.sourceIds = options.ids !== 'producer';
  }

  /** Agrees on the link's contract first: nothing is taken from upstream before. */
  start(): void {
    agreeOnContract(this.link as Link<unknown>, 'producer').then(
      () => this.run(),
      (error: unknown) => this.fail(error),
    );
  }

  private run(): void {
    if (this.ended) return;
    this.creditWatch = this.link.connection.subscribe(this.link.creditSubject, { callback: () => this.look() });
    const introspector = activeIntrospector();
    this.subscription = subscribeWithDemand(
      this.source,
      {
        next: (value) => this.publish(value),
        error: (error: unknown) => this.fail(error),
        complete: () => {
          this.sourceDone = true;
          this.settleIfDone();
        },
      },
      // Registered with its link before the source subscribes, so the stage feeding it finds it.
      introspector === undefined
        ? undefined
        : (link) => {
            this.own = link;
            this.introspector = introspector;
            introspector.runStarted(this, link, undefined);
          },
    );
    this.look();
  }

  /** Room on the link for this producer now. */
  private credit(): number {
    return this.link.config.capacity - this.backlog - this.uncounted;
  }

  /** Asks upstream for what the room and the window allow. */
  private ask(): void {
    if (this.ended) return;
    const parked = this.parked;
    if (parked !== undefined) {
      if (this.credit() <= 0) return this.waitForRoom();
      this.parked = undefined;
      this.dispatch(parked);
    }
    const subscription = this.subscription;
    if (subscription === undefined || subscription.closed) return;
    const allowed = Math.min(this.credit(), this.link.config.publishWindow - this.unconfirmed) - subscription.outstanding;
    if (allowed > 0) subscription.request(allowed);
    else if (this.credit() <= 0) {
      // A source may tell it has ended only when asked for one more (an iterator): ask, so a producer
      // that filled the link exactly still resolves. What comes instead is parked until there is room.
      if (subscription.outstanding === 0 && this.unconfirmed === 0 && !this.sourceDone) subscription.request(1);
      this.waitForRoom();
    }
  }

  private waitForRoom(): void {
    if (this.timer !== undefined || this.ended) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.look();
    }, this.link.config.creditInterval);
  }

  /** Reads the stream's backlog from the server and asks upstream for the room it leaves. */
  private look(): void {
    if (this.looking || this.ended) return;
    this.looking = true;
    this.confirmedDuringLook = [];
    this.link.jsm.streams.info(this.link.stream).then(
      (info) => {
        this.looking = false;
        this.backlog = info.state.messages;
        this.lookedSeq = info.state.last_seq;
        // Confirmed before the look was asked: counted. Sent and unconfirmed now: maybe not (their confirmation tells).
        let uncounted = this.unconfirmed - (this.parked === undefined ? 0 : 1);
        for (const seq of this.confirmedDuringLook) if (seq > this.lookedSeq) uncounted++;
        this.uncounted = uncounted;
        this.confirmedDuringLook = [];
        if (this.backlog > this.peakBacklog) this.peakBacklog = this.backlog;
        this.ask();
      },
      (error: unknown) => {
        this.looking = false;
        if (this.link.connection.isClosed())
          this.fail(disconnected(this.link.config.name, 'the connection closed.', 'Reconnect and run the producer again with the same producerId.', error));
        else if (definite(error)) this.fail(refused(this.link.config.name, `its stream ${this.link.stream} could not be read`, error));
        else this.waitForRoom(); // the server is away for now (a restart): look again later
      },
    );
  }

  private publish(input: T | Traced<T>): void {
    const traced = input instanceof Traced ? (input as Traced<T>) : undefined;
    let value = traced === undefined ? (input as T) : traced.value;
    const schema = this.link.schema;
    if (schema !== undefined) {
      const result = schema.safeParse(value);
      if (!result.success) {
        this.refuseInvalid(value, traced, invalidReason(result.error));
        return;
      }
      value = result.data;
    }
    const sequence = ++this.sequence;
    let body: Uint8Array | string;
    try {
      body = this.encode(value);
    } catch (error) {
      this.fail(error);
      return;
    }
    this.unconfirmed++;
    const settlement = traced?.trace.settlement;
    const outgoing: Outgoing = {
      body,
      id: this.idOf(sequence, settlement),
      headers: traced === undefined ? undefined : traceHeaders(traced.trace),
      value,
      settlement,
    };
    if (this.credit() > 0) this.dispatch(outgoing);
    else {
      // Taken to learn whether the source ended (see `ask`): it waits for room rather than be refused.
      this.parked = outgoing;
      this.waitForRoom();
    }
  }

  /** Sends a new message: it takes room the last look did not see taken. */
  private dispatch(outgoing: Outgoing): void {
    this.uncounted++;
    this.send(outgoing);
  }

  private refuseInvalid(value: T, traced: Traced<T> | undefined, reason: string): void {
    const error = new LinkError(
      'INVALID_MESSAGE',
      this.link.config.name,
      `an element was not sent: ${reason}.`,
      "Send values the link's schema admits, or open the link with onInvalid: 'skip'.",
    );
    if (!this.skipInvalid) {
      this.fail(error);
      return;
    }
    this.invalid++;
    forEachSettlement(value, traced?.trace.settlement, (settlement) => settlement.fail(error));
    this.ask();
  }

  /** The message id: from the source message and the output's ordinal, or from this producer's sequence. */
  private idOf(sequence: number, settlement: Settlement | undefined): string {
    const source = this.sourceIds ? sourceIdOf(settlement) : undefined;
    if (source === undefined || settlement === undefined) return `${this.producerId}-${sequence}`;
    const ordinal = this.ordinals.get(settlement) ?? 0;
    this.ordinals.set(settlement, ordinal + 1);
    return `${source}.${ordinal}`;
  }

  private send(outgoing: Outgoing): void {
    const { body, id, headers } = outgoing;
    this.link.js.publish(this.link.subject, body, { msgID: id, headers }).then(
      (ack) => {
        this.unconfirmed--;
        this.published++;
        if (ack.duplicate) this.duplicates++;
        if (this.looking) this.confirmedDuringLook.push(ack.seq);
        else if (ack.seq <= this.lookedSeq) this.uncounted--; // the last look counted it already
        // Stored on the server: the element is forwarded (a message it came from is acknowledged now).
        forEachSettlement(outgoing.value, outgoing.settlement, forward);
        if (!this.settleIfDone()) this.ask();
      },
      (error: unknown) => {
        if (this.ended) return;
        if (apiCode(error) === MAXIMUM_MESSAGES_EXCEEDED) {
          // Another producer took the room first: the element waits here, not lost, until a look finds room.
          this.refusals++;
          this.backlog = this.link.config.capacity;
          this.retryLater(outgoing);
        } else if (this.link.connection.isClosed()) {
          this.fail(
            disconnected(
              this.link.config.name,
              'the connection closed with publishes unconfirmed.',
              'Reconnect and run the producer again with the same producerId: the server drops what it already has.',
              error,
            ),
          );
        } else if (definite(error)) {
          this.fail(refused(this.link.config.name, 'a publish was refused', error));
        } else {
          this.retries++;
          this.retryLater(outgoing); // no confirmation (a timeout, a server restarting): the same msgID again
        }
      },
    );
  }

  private retryLater(outgoing: Outgoing): void {
    setTimeout(() => {
      if (!this.ended) this.send(outgoing);
    }, this.link.config.creditInterval);
  }

  private settleIfDone(): boolean {
    if (!this.sourceDone || this.unconfirmed > 0 || this.ended) return false;
    this.end();
    this.resolve({
      published: this.published,
      duplicates: this.duplicates,
      refusals: this.refusals,
      peakBacklog: this.peakBacklog,
      invalid: this.invalid,
      retries: this.retries,
    });
    return true;
  }

  private fail(error: unknown): void {
    if (this.ended) return;
    this.end();
    this.reject(error instanceof Error ? error : refused(this.link.config.name, 'publishing failed', error));
  }

  // ---- inspection ----

  get stats(): StageStats {
    let node = publisherNodes.get(this.link);
    if (node === undefined) publisherNodes.set(this.link, (node = new StageStats()));
    return node;
  }

  describe(): RunDescription {
    return {
      name: this.link.config.name,
      kind: 'nats-publish',
      capacity: this.link.config.publishWindow,
      concurrency: this.link.config.publishWindow,
      policy: 'pause',
    };
  }

  /** Taken from upstream; confirmed by the server; refused as invalid; sent and not confirmed yet. */
  counters(): RunCounters {
    return {
      received: this.published + this.invalid + this.unconfirmed,
      delivered: this.published,
      shed: {},
      failed: this.invalid,
      buffered: 0,
      inFlight: this.unconfirmed,
    };
  }

  demandNow(): number {
    return Number.POSITIVE_INFINITY;
  }

  ownLink(): DemandLink | undefined {
    return this.own;
  }

  private end(): void {
    this.ended = true;
    this.introspector?.runEnded(this);
    this.introspector = undefined;
    this.subscription?.cancel();
    this.creditWatch?.unsubscribe();
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** A publish under way: what to send again, and what to settle once it is stored. */
interface Outgoing {
  readonly body: Uint8Array | string;
  readonly id: string;
  readonly headers: MsgHdrs | undefined;
  readonly value: unknown;
  readonly settlement: Settlement | undefined;
}

function forward(settlement: Settlement): void {
  settlement.deliver(true);
}
