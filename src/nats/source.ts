/**
 * The receiving end of a link: a Flow whose downstream demand becomes pulls from the link's
 * consumer, never of more messages than were asked for and not yet delivered (§1.1).
 *
 * Each element is a `Traced` value whose trace continues the sender's (its `traceparent` and
 * sampled records ride in the message headers) and carries the message's settlement: the
 * message is acknowledged when the pipeline is done with the element, by the rule in
 * `settleMessage`. Messages fetched or still in the pipeline when the consumer leaves are
 * `nak`ed at once, so another receiver gets them now rather than after `ackWait`.
 */
import { activeIntrospector, type InspectedRun, type RunCounters, type RunDescription } from '../flow/introspection.js';
import { StageStats } from '../flow/stats.js';
import { functionSchema, parseOptions, positiveInt } from '../flow/options.js';
import { lazySchema } from '../core/zod.js';
import type { JsMsg, Consumer, ConsumerMessages } from '@nats-io/jetstream';
import { Settlement, type Settled, type Settler } from '../core/settlement.js';
import { TraceContext, type StageRecord, type Traced, parseTraceparent } from '../core/trace.js';
import { Flow, type CoreOutlet, type Producer } from '../flow/demand.js';
import { Ring } from '../flow/ring.js';
import { type Link, LinkError, definite, disconnected, refused } from './link.js';
import { agreeOnContract } from './contract.js';
import { RECORDS, SEQ, TRACEPARENT, deadLetter, describe, invalidReason, letterOf, reasonCode } from './wire.js';
import { Trials } from './trials.js';
import { SettledLog, idOf } from './settled-log.js';
import { StrandedMessages } from './reclaim.js';
import { errorMessage } from '../core/errors.js';

/** The message an element came from, for settling it by hand. Settle it once; later settlements change nothing. */
export interface LinkMessage<T> {
  /** The message's value, as received. */
  readonly value: T;
  /** The message's sequence in the link's stream. */
  readonly seq: number;
  /** `<stream>-<seq>`: the message, for good (a redelivery has the same origin). */
  readonly origin: string;
  /** The id its producer gave it (`Nats-Msg-Id`: the same for a copy stored again), else its origin. */
  readonly id: string;
  /** 1 on first delivery; more after a receiver failed to settle it in time or `nak`ed it. */
  readonly deliveries: number;
  /** Done with it: the server deletes it and the link has room for one more. */
  ack(): void;
  /** Not done: deliver it again (to any receiver), after `delay` ms if given. */
  nak(delay?: number): void;
  /** Give up on it: moved to the link's dead-letter stream with `reason`, never delivered again. */
  term(reason: string): void;
  /** Still working on it: the server waits another `ackWait` before delivering it again. */
  working(): void;
}

/** What a receiver did with the messages of a link (one object can serve several receivers). */
export class LinkReceiverStats {
  /** Messages pulled from the link (a redelivered message counts each time). */
  received = 0;
  /** Of those, deliveries after the first: another receiver or an earlier pull did not settle it. */
  redelivered = 0;
  acked = 0;
  /** Given back: the consumer left, or a shed element under `onShed: 'nak'`. */
  nacked = 0;
  /** Failed elements and messages not valid for the link, kept in its dead-letter stream. */
  deadLettered = 0;
  /** Pulls tried again after a passing failure (a server restart, a reconnect). */
  pullRetries = 0;
  /** Copies of messages settled within `dedupWindow`, or held here under another sequence: acknowledged, not handed on (also counted in `acked`). */
  duplicates = 0;
  /** Messages an unclean server stop left in the stream that the consumer would never deliver again: put back in the queue. */
  requeued = 0;
  /** Messages done with whose settled record the server has not confirmed yet: acknowledged once it has. */
  settling = 0;
  /** Deliveries not settled by a receiver: held now, or held past `ackWait` and delivered again. */
  get held(): number {
    return this.received - this.acked - this.nacked - this.deadLettered - this.settling;
  }
}

/** Options of `fromLink`. */
export interface FromLinkOptions {
  /** Messages one pull asks for at most (default 64). */
  maxBatch?: number;
  /** The element for a message body (default: JSON), before the link's schema checks it. */
  decode?: (body: Uint8Array) => unknown;
  /** A shed element's message: `'ack'` (default: the pipeline chose to drop it) or `'nak'` (delivered again). */
  onShed?: 'ack' | 'nak';
  /** Counters to add to (default: a new one, unread). */
  stats?: LinkReceiverStats;
  /**
   * Tells the server, every `ackWait / 2`, that messages still in the pipeline are being worked
   * on (`working()`), so long work is not delivered again meanwhile (default true). A message is
   * kept alive for `maxHold` ms at most (default 300 000): one a plain operator dropped is then
   * delivered again.
   */
  keepAlive?: boolean;
  maxHold?: number;
  /** Called for each message dead-lettered, with its reason (a failed element, a message not valid for the link). */
  onDeadLetter?: (event: { readonly seq: number; readonly reason: string }) => void;
  /** Called when messages an unclean server stop stranded in the stream were put back in the queue (see `LinkReceiverStats.requeued`). */
  onRequeue?: (event: { readonly messages: number }) => void;
}

/** A Flow of the messages of `link`, pulled as downstream asks, each acknowledged when the pipeline is done with it. */
const fromLinkSchema = lazySchema((z) =>
  z.strictObject({
    maxBatch: positiveInt('maxBatch').optional(),
    decode: functionSchema<(body: Uint8Array) => unknown>().optional(),
    onShed: z.enum(['ack', 'nak'], { error: "onShed must be 'ack' or 'nak'" }).optional(),
    stats: z.instanceof(LinkReceiverStats, { error: 'stats must be a LinkReceiverStats' }).optional(),
    keepAlive: z.boolean({ error: 'keepAlive must be a boolean' }).optional(),
    maxHold: positiveInt('maxHold').optional(),
    onDeadLetter: functionSchema<FromLinkOptions['onDeadLetter']>().optional(),
    onRequeue: functionSchema<FromLinkOptions['onRequeue']>().optional(),
  }),
);

/** A Flow of the elements of `link`: messages are pulled only as the pipeline asks, and each is acknowledged when its element settles. */
export function fromLink<T = unknown>(link: Link<T> | Link, options: FromLinkOptions = {}): Flow<Traced<T>> {
  parseOptions(fromLinkSchema(), options, 'fromLink options');
  const receiver: ReceiverConfig = {
    maxBatch: options.maxBatch ?? 64,
    decode: options.decode ?? ((body: Uint8Array) => JSON.parse(new TextDecoder().decode(body))),
    shedNaks: options.onShed === 'nak',
    stats: options.stats ?? new LinkReceiverStats(),
    onDeadLetter: options.onDeadLetter,
    onRequeue: options.onRequeue,
    keepAlive: options.keepAlive ?? true,
    maxHold: options.maxHold ?? 300_000,
  };
  return new Flow<Traced<T>>((outlet) => new LinkProducer(link, outlet, receiver));
}

/** The id of the link message a settlement belongs to (see `LinkMessage.id`), if it belongs to one. */
export function sourceIdOf(settlement: Settlement | undefined): string | undefined {
  const settler = settlement?.settler;
  return settler instanceof Received ? settler.id : undefined;
}

/**
 * The link message an element came from (or was derived from, through any stage), if it came
 * from a link: pass the element, or a stage's work context (`linkMessageOf(context).working()`).
 */
export function linkMessageOf(element: { readonly trace: TraceContext }): LinkMessage<unknown> | undefined {
  const settler = element.trace.settlement?.settler;
  return settler instanceof Received ? settler : undefined;
}

interface ReceiverConfig {
  readonly maxBatch: number;
  readonly decode: (body: Uint8Array) => unknown;
  readonly shedNaks: boolean;
  readonly stats: LinkReceiverStats;
  readonly onDeadLetter: ((event: { readonly seq: number; readonly reason: string }) => void) | undefined;
  readonly onRequeue: ((event: { readonly messages: number }) => void) | undefined;
  readonly keepAlive: boolean;
  readonly maxHold: number;
}

class Received<T> implements LinkMessage<T>, Settler {
  readonly settlement = new Settlement(this);
  private settled = false;
  constructor(
    readonly value: T,
    private readonly message: JsMsg,
    private readonly receiver: LinkProducer<T>,
  ) {}
  get seq(): number {
    return this.message.seq;
  }
  get origin(): string {
    return `${this.message.info.stream}-${this.message.seq}`;
  }
  get id(): string {
    return idOf(this.message);
  }
  get deliveries(): number {
    return this.message.info.deliveryCount;
  }
  /**
   * The rule: delivered → ack; shed → ack (or nak under `onShed: 'nak'`), but shed because the
   * consumer left → nak; failed → moved to the dead-letter stream with the error as reason.
   */
  settle(settled: Settled): void {
    if (settled.outcome === 'delivered') this.done(settled.forwarded === true);
    else if (settled.outcome === 'failed') this.giveUp(describe(settled.error), reasonCode(settled.error));
    else if (settled.reason === 'cancelled' || this.receiver.config.shedNaks) this.nak();
    else this.ack();
  }
  ack(): void {
    this.done(false);
  }
  /**
   * Acknowledges it. Its id is recorded as settled unless every output went on to another link:
   * that link's receivers drop copies of those outputs, and a copy of this message (a server that
   * lost its acknowledgement) is worked on again, which restores an output the server lost with it.
   */
  private done(forwarded: boolean): void {
    if (!this.claim()) return;
    this.receiver.unhold(this);
    if (forwarded) this.receiver.forwarded(this.message);
    else this.receiver.finish(this.message, 'acked');
  }
  nak(delay?: number): void {
    if (!this.claim()) return;
    this.receiver.unhold(this);
    this.receiver.giveBack(this.message, delay);
  }
  term(reason: string): void {
    this.giveUp(reason, 'TERMINATED');
  }
  private giveUp(reason: string, code: string): void {
    if (!this.claim()) return;
    this.receiver.unhold(this);
    this.receiver.deadLetter(this.message, reason, code);
  }
  working(): void {
    if (!this.settled) this.message.working();
  }
  /** When it was received (ms, `Date.now()`): `keepAlive` stops at `maxHold` after it. */
  readonly receivedAt = Date.now();
  private claim(): boolean {
    if (this.settled) return false;
    this.settled = true;
    this.settlement.close();
    return true;
  }
}

/** The inspector's node of a receiver's stats: one per `LinkReceiverStats`, as for a stage's `StageStats`. */
const receiverNodes = new WeakMap<LinkReceiverStats, StageStats>();

class LinkProducer<T> implements Producer, InspectedRun {
  private consumer: Consumer | undefined;
  private messages: ConsumerMessages | undefined;
  /** Fetched, not yet emitted. */
  private readonly buffer = new Ring<JsMsg>(16);
  /** Asked for in the pull under way and not yet arrived. */
  private asked = 0;
  private done = false;
  private nudgeQueued = false;
  /** Emitted and not yet settled. */
  private readonly held = new Set<Received<T>>();
  /** By id, the held element of each message emitted and not settled: a copy of one is not handed on. */
  private readonly heldIds = new Map<string, Received<T>>();
  private ticker: ReturnType<typeof setInterval> | undefined;
  private trials: Trials | undefined;
  private readonly settledLog: SettledLog;
  private reclaiming = false;
  private readonly stranded: StrandedMessages;

  constructor(
    private readonly link: Link<T>,
    private readonly outlet: CoreOutlet<Traced<T>>,
    readonly config: ReceiverConfig,
  ) {
    this.settledLog = new SettledLog(link as Link<unknown>);
    this.stranded = new StrandedMessages(link as Link<unknown>);
  }

  // ---- inspection ----

  get stats(): StageStats {
    let node = receiverNodes.get(this.config.stats);
    if (node === undefined) receiverNodes.set(this.config.stats, (node = new StageStats()));
    return node;
  }

  describe(): RunDescription {
    return { name: this.link.config.name, kind: 'nats-receive', capacity: this.config.maxBatch, concurrency: 1, policy: this.config.shedNaks ? 'nak' : 'ack' };
  }

  /** Pulled, acknowledged, given back (`nak`: shed `cancelled`), dead-lettered; fetched and not emitted; emitted and not settled. */
  counters(): RunCounters {
    const stats = this.config.stats;
    return {
      received: stats.received,
      delivered: stats.acked,
      shed: { cancelled: stats.nacked },
      failed: stats.deadLettered,
      buffered: this.buffer.length,
      inFlight: this.held.size,
    };
  }

  demandNow(): number {
    return this.outlet.demand();
  }

  ownLink(): undefined {
    return undefined;
  }

  start(): void {
    this.trials = new Trials(this.link as Link<unknown>, (seq) => this.holds(seq));
    this.ticker = setInterval(() => this.tick(), this.link.config.ackWait / 2);
    this.ticker.unref();
    this.begin();
  }

  /**
   * The contract first: no message is pulled before the link's producers and this receiver agree;
   * then every id settled before this receiver started is known before it pulls a first message.
   * A passing failure (a timeout while a cluster elects a leader, a reconnect) is tried again
   * every `creditInterval`; a definite one fails the flow.
   */
  private begin(): void {
    if (this.done) return;
    agreeOnContract(this.link as Link<unknown>, 'receiver')
      .then(() =>
        this.settledLog.start().catch((error: unknown) => {
          throw refused(this.link.config.name, `its settled-ids stream ${this.link.settledStream} could not be read`, error);
        }),
      )
      .then(() => this.link.js.consumers.get(this.link.stream, this.link.durable))
      .then(
        (consumer) => {
          this.consumer = consumer;
          this.pull();
        },
        (error: unknown) => {
          if (this.done) return;
          const cause = error instanceof LinkError ? error.cause : error;
          const passing = (!(error instanceof LinkError) || error.code === 'LINK_REFUSED') && !definite(cause) && !this.link.connection.isClosed();
          if (!passing) {
            this.fail(error instanceof LinkError ? error : refused(this.link.config.name, `its consumer ${this.link.durable} could not be found`, error));
            return;
          }
          this.config.stats.pullRetries++;
          setTimeout(() => this.begin(), this.link.config.creditInterval);
        },
      );
  }

  pull(): void {
    if (this.done) return;
    while (this.buffer.length > 0 && this.outlet.wants()) this.emit(this.buffer.shift()!);
    if (this.done || this.consumer === undefined || this.asked > 0 || this.buffer.length > 0) return;
    // `wants()` first: a producer told no is resumed when demand returns (`demand()` alone registers nothing).
    if (this.outlet.wants()) this.fetch(this.consumer, Math.max(1, Math.min(this.outlet.demand(), this.config.maxBatch)));
  }

  private fetch(consumer: Consumer, count: number): void {
    this.asked = count;
    this.receive(consumer, count).then(
      () => {
        this.messages = undefined;
        this.asked = 0;
        this.pull();
      },
      (error: unknown) => {
        this.messages = undefined;
        this.asked = 0;
        this.pullFailed(error);
      },
    );
  }

  private async receive(consumer: Consumer, count: number): Promise<void> {
    const messages = await consumer.fetch({ max_messages: count, expires: this.link.config.pullExpires });
    this.messages = messages;
    for await (const message of messages) {
      this.asked--;
      this.config.stats.received++;
      if (this.done) this.giveBack(message);
      else if (this.isCopy(message)) {
        this.config.stats.duplicates++;
        this.finish(message, 'acked');
      } else if (message.info.deliveryCount > 1) this.redelivered(message);
      else if (this.buffer.length === 0 && this.outlet.wants()) this.emit(message);
      else this.buffer.push(message);
    }
  }

  /**
   * A message delivered again is judged before it goes on (see `trials.ts`): handed back on
   * purpose, it goes on as any; else it becomes this receiver's one trial, or is dead-lettered if
   * its trials failed too often. One to try while another is tried here is given back for another
   * receiver (after `creditInterval`).
   */
  private redelivered(message: JsMsg): void {
    this.config.stats.redelivered++;
    const trials = this.trials!;
    // Ours again: the server gave up on the delivery this receiver still holds.
    if (trials.seq === message.seq) trials.expired(message.seq);
    trials.judge(message.seq).then(
      (verdict) => {
        if (this.done) this.giveBack(message);
        else if (verdict.kind === 'give-up') this.deadLetter(message, verdict.reason, verdict.code);
        else if (verdict.kind === 'busy') {
          message.nak(this.link.config.creditInterval);
          this.settledAs('nacked');
        } else {
          this.buffer.push(message);
          this.pull();
        }
      },
      () => {
        // The server is away for now: deliver it again later, here or elsewhere.
        message.nak(this.link.config.creditInterval);
        this.settledAs('nacked');
      },
    );
  }

  /** A copy of a message settled within `dedupWindow`, or of another held here now (a redone output stored again). */
  private isCopy(message: JsMsg): boolean {
    const id = idOf(message);
    if (this.settledLog.has(id)) return true;
    const held = this.heldIds.get(id);
    return held !== undefined && held.seq !== message.seq;
  }

  /** Done with `message` for good: its id is recorded as settled, then, once the server stored the record, it is acknowledged and counted. */
  finish(message: JsMsg, as: 'acked' | 'deadLettered'): void {
    this.config.stats.settling++;
    this.settledLog.record(idOf(message), () => {
      this.config.stats.settling--;
      message.ack();
      this.settledAs(as, message);
    });
  }

  /** Done with `message`, whose outputs went on to another link: acknowledged, its id not recorded. */
  forwarded(message: JsMsg): void {
    message.ack();
    this.settledAs('acked', message);
  }

  /** Whether this receiver has the message `seq`: fetched and not emitted, or emitted and not settled. */
  private holds(seq: number): boolean {
    for (let i = 0; i < this.buffer.length; i++) if (this.buffer.at(i)!.seq === seq) return true;
    for (const received of this.held) if (received.seq === seq) return true;
    return false;
  }

  /**
   * A pull failed. The server's definite answer (its consumer is gone) or a closed connection ends
   * the flow with a `LinkError`; anything else (a server restarting, a client reconnecting) is
   * tried again after `creditInterval`, for as long as the client keeps reconnecting.
   */
  private pullFailed(error: unknown): void {
    if (this.done) return;
    const name = this.link.config.name;
    if (this.link.connection.isClosed()) {
      this.fail(
        disconnected(name, 'the connection closed while receiving.', 'Reconnect and subscribe again: what was not acknowledged is delivered again.', error),
      );
    } else if (definite(error)) {
      this.fail(refused(name, 'a pull failed', error));
    } else {
      this.config.stats.pullRetries++;
      setTimeout(() => this.pull(), this.link.config.creditInterval);
    }
  }

  private emit(message: JsMsg): void {
    let value: T;
    try {
      value = this.valueOf(message);
    } catch (error) {
      this.deadLetter(message, describe(error), 'INVALID_MESSAGE');
      return;
    }
    const received = new Received(value, message, this);
    this.held.add(received);
    this.heldIds.set(received.id, received);
    const trace = traceFrom(message);
    trace.settlement = received.settlement;
    this.outlet.nextTraced(value, trace);
  }

  private valueOf(message: JsMsg): T {
    let decoded: unknown;
    try {
      decoded = this.config.decode(message.data);
    } catch (error) {
      throw new Error(`undecodable: ${errorMessage(error)}`);
    }
    const schema = this.link.schema;
    if (schema === undefined) return decoded as T;
    const result = schema.safeParse(decoded);
    if (!result.success) throw new Error(invalidReason(result.error));
    return result.data;
  }

  /**
   * Keeps `message` in the dead-letter stream with `reason`, then acknowledges it: a work queue
   * keeps a terminated message (nats-server 2.9), where it would hold a place of the link's
   * capacity for good. If the dead letter cannot be stored, the message is delivered again.
   */
  deadLetter(message: JsMsg, reason: string, code: string): void {
    const deliveries = message.info.deliveryCount;
    deadLetter(this.link, letterOf(message), reason).then(
      () => {
        this.finish(message, 'deadLettered');
        this.config.onDeadLetter?.({ seq: message.seq, reason });
        activeIntrospector()?.deadLettered?.(this, { subject: message.subject, seq: message.seq, code, deliveries });
      },
      () => {
        message.nak(this.link.config.creditInterval);
        this.settledAs('nacked');
      },
    );
  }

  /** A message was settled: counted, and producers waiting for room are told, once per turn of the event loop. */
  settledAs(as: 'acked' | 'nacked' | 'deadLettered', message?: JsMsg): void {
    this.config.stats[as]++;
    // Delivered more than once, it may have a trial record: settled for good, the record goes.
    if (message !== undefined && message.info.deliveryCount > 1) this.trials?.settled(message.seq);
    if (this.nudgeQueued) return;
    this.nudgeQueued = true;
    queueMicrotask(() => {
      this.nudgeQueued = false;
      if (!this.link.connection.isClosed()) this.link.connection.publish(this.link.creditSubject);
    });
  }

  /** Gives a message back on purpose: delivered again (after `delay` ms), recorded as no failure of its own. */
  giveBack(message: JsMsg, delay?: number): void {
    this.trials?.givenBack(message.seq);
    message.nak(delay);
    this.settledAs('nacked');
  }

  unhold(received: Received<T>): void {
    this.held.delete(received);
    if (this.heldIds.get(received.id) === received) this.heldIds.delete(received.id);
  }

  /** Every `ackWait / 2`: stranded messages looked for; messages in the pipeline kept alive (`keepAlive`). */
  private tick(): void {
    this.reclaim();
    const now = Date.now();
    const kept = this.config.keepAlive ? this.config.maxHold : 0;
    const trial = this.trials?.seq;
    for (const received of this.held) {
      if (received.receivedAt >= now - kept) received.working();
      // Held past its time, the trial's message has been delivered again: this receiver may try another.
      else if (received.seq === trial && received.receivedAt < now - kept - this.link.config.ackWait) this.trials!.expired(trial);
    }
  }

  /** Puts back what an unclean server stop left in the stream that the consumer would never deliver again (`reclaim.ts`). */
  private reclaim(): void {
    if (this.reclaiming || this.consumer === undefined) return;
    this.reclaiming = true;
    this.stranded
      .look()
      .then((requeued) => {
        if (requeued === 0) return;
        this.config.stats.requeued += requeued;
        this.config.onRequeue?.({ messages: requeued });
      })
      .catch(() => {}) // the server is away: the next look
      .finally(() => (this.reclaiming = false));
  }

  private fail(error: unknown): void {
    if (this.done) return;
    this.cancel();
    this.outlet.error(error);
  }

  cancel(): void {
    if (this.done) return;
    this.done = true;
    if (this.ticker !== undefined) clearInterval(this.ticker);
    this.trials?.close();
    this.settledLog.close();
    // Fetched and never handed on: back to the link now, not after ackWait. What was handed on is
    // settled where it is: a stage torn down sheds what it held as `cancelled` (→ nak), and what
    // went past the consumer that left (`take`) goes on to be delivered.
    while (this.buffer.length > 0) this.giveBack(this.buffer.shift()!);
    // A pull still owed messages keeps its subscription until it is filled or expires (`pullExpires`):
    // what the server sends it after the consumer left is given back, not dropped to wait out `ackWait`.
    if (this.asked <= 0) this.messages?.stop();
  }
}

/** The trace a message continues: the sender's trace id, span and sampled records, and its element's seq. */
function traceFrom(message: JsMsg): TraceContext {
  const headers = message.headers;
  const parent = headers === undefined ? undefined : parseTraceparent(headers.get(TRACEPARENT));
  const seqHeader = headers === undefined ? Number.NaN : Number(headers.get(SEQ));
  const trace = new TraceContext(Number.isInteger(seqHeader) ? seqHeader : message.seq, parent?.sampled ?? false, parent);
  if (trace.sampled && headers?.has(RECORDS)) {
    try {
      for (const record of JSON.parse(headers.get(RECORDS)) as StageRecord[]) trace.addRecord(record);
    } catch {
      // Records that do not parse are left out: the trace goes on without them.
    }
  }
  return trace;
}
