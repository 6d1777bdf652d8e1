/**
 * The receiving end of a link: a Flow whose downstream demand becomes pulls from the link's
 * consumer, never of more messages than were asked for and not yet delivered (§1.1). Each element
 * is a `LinkMessage` carrying its acknowledgement: the receiver settles it once the pipeline is
 * done with it (`ack`, `nak` to have it sent again, `term` to give up on it). Messages fetched but
 * not yet emitted when the consumer leaves are `nak`ed at once, so another receiver gets them now
 * rather than after `ackWait`.
 */
import type { JsMsg, Consumer, ConsumerMessages } from '@nats-io/jetstream';
import { Flow, type Outlet, type Producer } from '../flow/demand.js';
import { Ring } from '../flow/ring.js';
import { type Link, refused } from './link.js';

/** One message of a link, with its acknowledgement. Settle it exactly once. */
export interface LinkMessage<T> {
  readonly value: T;
  /** The message's sequence in the link's stream. */
  readonly seq: number;
  /** 1 on first delivery; more after a receiver failed to settle it in time or `nak`ed it. */
  readonly deliveries: number;
  /** Done with it: the server deletes it and the link has room for one more. */
  ack(): void;
  /** Not done: deliver it again (to any receiver), after `delay` ms if given. */
  nak(delay?: number): void;
  /** Give up on it: never delivered again. */
  term(reason?: string): void;
  /** Still working on it: the server waits another `ackWait` before delivering it again. */
  working(): void;
}

export interface FromLinkOptions<T> {
  /** Messages one pull asks for at most (default 64). */
  maxBatch?: number;
  /** The element for a message body (default: JSON). */
  decode?: (body: Uint8Array) => T;
}

/** A Flow of the messages of `link`, pulled as downstream asks. */
export function fromLink<T>(link: Link, options: FromLinkOptions<T> = {}): Flow<LinkMessage<T>> {
  const maxBatch = options.maxBatch ?? 64;
  const decode = options.decode ?? ((body: Uint8Array) => JSON.parse(new TextDecoder().decode(body)) as T);
  return new Flow<LinkMessage<T>>((outlet) => new LinkProducer(link, outlet, maxBatch, decode));
}

class Received<T> implements LinkMessage<T> {
  private settled = false;
  constructor(
    readonly value: T,
    private readonly message: JsMsg,
    private readonly freed: () => void,
  ) {}
  get seq(): number {
    return this.message.seq;
  }
  get deliveries(): number {
    return this.message.info.deliveryCount;
  }
  ack(): void {
    if (this.settle()) this.message.ack();
  }
  nak(delay?: number): void {
    if (this.settle()) this.message.nak(delay);
  }
  term(reason?: string): void {
    if (this.settle()) this.message.term(reason);
  }
  working(): void {
    if (!this.settled) this.message.working();
  }
  private settle(): boolean {
    if (this.settled) return false;
    this.settled = true;
    this.freed();
    return true;
  }
}

class LinkProducer<T> implements Producer {
  private consumer: Consumer | undefined;
  private messages: ConsumerMessages | undefined;
  /** Fetched, not yet emitted. */
  private readonly buffer = new Ring<JsMsg>(16);
  /** Asked for in the pull under way and not yet arrived. */
  private asked = 0;
  private done = false;
  private nudgeQueued = false;

  constructor(
    private readonly link: Link,
    private readonly outlet: Outlet<LinkMessage<T>>,
    private readonly maxBatch: number,
    private readonly decode: (body: Uint8Array) => T,
  ) {}

  start(): void {
    this.link.js.consumers.get(this.link.stream, this.link.durable).then(
      (consumer) => {
        this.consumer = consumer;
        this.pull();
      },
      (error: unknown) => this.fail(refused(this.link.config.name, `its consumer ${this.link.durable} could not be found`, error)),
    );
  }

  pull(): void {
    if (this.done) return;
    while (this.buffer.length > 0 && this.outlet.wants()) this.emit(this.buffer.shift()!);
    if (this.done || this.consumer === undefined || this.asked > 0 || this.buffer.length > 0) return;
    // `wants()` first: a producer told no is resumed when demand returns (`demand()` alone registers nothing).
    if (this.outlet.wants()) this.fetch(this.consumer, Math.max(1, Math.min(this.outlet.demand(), this.maxBatch)));
  }

  private fetch(consumer: Consumer, count: number): void {
    this.asked = count;
    consumer.fetch({ max_messages: count, expires: this.link.config.pullExpires }).then(
      async (messages) => {
        this.messages = messages;
        for await (const message of messages) {
          this.asked--;
          if (this.done) message.nak();
          else if (this.buffer.length === 0 && this.outlet.wants()) this.emit(message);
          else this.buffer.push(message);
        }
        this.messages = undefined;
        this.asked = 0;
        this.pull();
      },
      (error: unknown) => {
        this.asked = 0;
        this.fail(refused(this.link.config.name, 'a pull failed', error));
      },
    );
  }

  private emit(message: JsMsg): void {
    let value: T;
    try {
      value = this.decode(message.data);
    } catch (error) {
      message.term(`undecodable: ${error instanceof Error ? error.message : String(error)}`);
      return;
    }
    this.outlet.next(new Received(value, message, this.freed));
  }

  /** A message was settled: producers waiting for room are told, once per turn of the event loop. */
  private readonly freed = (): void => {
    if (this.nudgeQueued) return;
    this.nudgeQueued = true;
    queueMicrotask(() => {
      this.nudgeQueued = false;
      if (!this.link.connection.isClosed()) this.link.connection.publish(this.link.creditSubject);
    });
  };

  private fail(error: unknown): void {
    if (this.done) return;
    this.cancel();
    this.outlet.error(error);
  }

  cancel(): void {
    if (this.done) return;
    this.done = true;
    // Fetched and never handed on: back to the link now, not after ackWait.
    while (this.buffer.length > 0) this.buffer.shift()!.nak();
    this.messages?.stop();
  }
}
