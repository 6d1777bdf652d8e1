/**
 * The producing end of a link: a sink that takes elements from upstream only while the link has
 * room, and publishes each once (a `msgID` of producer id and sequence lets the server drop a
 * retried duplicate).
 *
 * Credit: room = capacity − the stream's backlog at the last look − what was published since.
 * The backlog is read from the server (the stream's message count: a work queue deletes a message
 * when a receiver acknowledges it), so credit cannot be lost for good: it is recomputed when
 * receivers announce freed room on the link's credit subject, and on a timer when none does. A
 * publish the server refuses for the bound (several producers raced for the same room) is kept
 * and sent again once there is room; nothing is dropped.
 */
import type { Observable } from 'rxjs';
import type { Subscription as NatsSubscription } from '@nats-io/nats-core';
import { subscribeWithDemand, type DemandSubscription } from '../flow/demand.js';
import { type Link, LinkError, MAXIMUM_MESSAGES_EXCEEDED, apiCode, refused } from './link.js';

export interface ToLinkOptions<T> {
  /** Names this producer in message ids (default: random). Reuse it after a restart to let the server drop what it already has. */
  producerId?: string;
  /** The message body for an element (default: JSON). */
  encode?: (value: T) => Uint8Array | string;
}

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
}

/**
 * Publishes every element of `source` to `link`, pulling from upstream only as the link has room
 * and at most `publishWindow` publishes unconfirmed. Resolves when the source completed and every
 * publish was confirmed; rejects with the source's error, or a `LinkError` (upstream is cancelled).
 */
export function toLink<T>(source: Observable<T>, link: Link, options: ToLinkOptions<T> = {}): Promise<PublishSummary> {
  return new Promise((resolve, reject) => new Publisher(source, link, options, resolve, reject).start());
}

class Publisher<T> {
  private readonly producerId: string;
  private readonly encode: (value: T) => Uint8Array | string;
  private subscription: DemandSubscription | undefined;
  private creditWatch: NatsSubscription | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  /** Elements received and not yet confirmed. */
  private unconfirmed = 0;
  private sequence = 0;
  /** The stream's message count at the last look, and what this producer had sent by then. */
  private backlog = 0;
  private sentAtLook = 0;
  private sent = 0;
  private looking = false;
  private sourceDone = false;
  private ended = false;
  private published = 0;
  private duplicates = 0;
  private refusals = 0;
  private peakBacklog = 0;

  constructor(
    private readonly source: Observable<T>,
    private readonly link: Link,
    options: ToLinkOptions<T>,
    private readonly resolve: (summary: PublishSummary) => void,
    private readonly reject: (error: unknown) => void,
  ) {
    this.producerId = options.producerId ?? Math.random().toString(36).slice(2, 12);
    this.encode = options.encode ?? ((value: T) => JSON.stringify(value));
  }

  start(): void {
    this.creditWatch = this.link.connection.subscribe(this.link.creditSubject, { callback: () => this.look() });
    this.subscription = subscribeWithDemand(this.source, {
      next: (value) => this.publish(value),
      error: (error: unknown) => this.fail(error),
      complete: () => {
        this.sourceDone = true;
        this.settleIfDone();
      },
    });
    this.look();
  }

  /** Room on the link for this producer now. */
  private credit(): number {
    return this.link.config.capacity - this.backlog - (this.sent - this.sentAtLook);
  }

  /** Asks upstream for what the room and the window allow. */
  private ask(): void {
    const subscription = this.subscription;
    if (subscription === undefined || subscription.closed || this.ended) return;
    const allowed = Math.min(this.credit(), this.link.config.publishWindow - this.unconfirmed) - subscription.outstanding;
    if (allowed > 0) subscription.request(allowed);
    else if (this.credit() <= 0) this.waitForRoom();
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
    const sentBefore = this.sent;
    this.link.jsm.streams.info(this.link.stream).then(
      (info) => {
        this.looking = false;
        this.backlog = info.state.messages;
        this.sentAtLook = sentBefore;
        if (this.backlog > this.peakBacklog) this.peakBacklog = this.backlog;
        this.ask();
      },
      (error: unknown) => {
        this.looking = false;
        if (this.link.connection.isClosed())
          this.fail(
            new LinkError(
              'LINK_DISCONNECTED',
              this.link.config.name,
              'the connection closed.',
              'Reconnect and run the producer again with the same producerId.',
              error,
            ),
          );
        else this.waitForRoom(); // the server is away for now (a restart): look again later
      },
    );
  }

  private publish(value: T): void {
    const sequence = ++this.sequence;
    let body: Uint8Array | string;
    try {
      body = this.encode(value);
    } catch (error) {
      this.fail(error);
      return;
    }
    this.unconfirmed++;
    this.sent++;
    this.send(body, sequence);
  }

  private send(body: Uint8Array | string, sequence: number): void {
    this.link.js.publish(this.link.subject, body, { msgID: `${this.producerId}-${sequence}` }).then(
      (ack) => {
        this.unconfirmed--;
        this.published++;
        if (ack.duplicate) this.duplicates++;
        if (!this.settleIfDone()) this.ask();
      },
      (error: unknown) => {
        if (this.ended) return;
        if (apiCode(error) === MAXIMUM_MESSAGES_EXCEEDED) {
          // Another producer took the room first: the element waits here, not lost, until a look finds room.
          this.refusals++;
          this.backlog = this.link.config.capacity;
          this.sentAtLook = this.sent;
          this.retryLater(body, sequence);
        } else if (this.link.connection.isClosed()) {
          this.fail(
            new LinkError(
              'LINK_DISCONNECTED',
              this.link.config.name,
              'the connection closed with publishes unconfirmed.',
              'Reconnect and run the producer again with the same producerId: the server drops what it already has.',
              error,
            ),
          );
        } else {
          this.retryLater(body, sequence); // no confirmation (a timeout, a server restart): the same msgID again
        }
      },
    );
  }

  private retryLater(body: Uint8Array | string, sequence: number): void {
    setTimeout(() => {
      if (!this.ended) this.send(body, sequence);
    }, this.link.config.creditInterval);
  }

  private settleIfDone(): boolean {
    if (!this.sourceDone || this.unconfirmed > 0 || this.ended) return false;
    this.end();
    this.resolve({ published: this.published, duplicates: this.duplicates, refusals: this.refusals, peakBacklog: this.peakBacklog });
    return true;
  }

  private fail(error: unknown): void {
    if (this.ended) return;
    this.end();
    this.reject(error instanceof Error ? error : refused(this.link.config.name, 'publishing failed', error));
  }

  private end(): void {
    this.ended = true;
    this.subscription?.cancel();
    this.creditWatch?.unsubscribe();
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
  }
}
