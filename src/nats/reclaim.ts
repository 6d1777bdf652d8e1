/**
 * Messages a link's stream keeps that its consumer will never deliver again. A server that stopped
 * uncleanly (SIGKILL, a crash) can come back with its consumer's state ahead of the work queue:
 * messages acknowledged whose removal was lost, and messages delivered whose pending state was
 * lost. Either way the consumer counts them done, and each holds a place of the link's capacity
 * for good (producers would wait for room that never comes). They cannot be told apart, so each
 * is put back at the end of the queue under its id: receivers drop the copy of one already settled
 * (`settled-log.ts`), and work on one that never was.
 *
 * Such a message is at or below the consumer's acknowledgement floor, or, when nothing is pending
 * acknowledgement, at or below the last sequence it delivered.
 */
import type { MsgRequest, StoredMsg } from '@nats-io/jetstream';
import { natsTransport } from '../core/peers.js';
import { type Link, MAXIMUM_MESSAGES_EXCEEDED, apiCode, definite } from './link.js';
import { ID } from './wire.js';

/**
 * One receiver's watch for stranded messages. A message is put back only when two looks in a row
 * found it stranded: the server removes an acknowledged message a moment after it counts the
 * acknowledgement, and one look could catch it in between.
 */
export class StrandedMessages {
  private suspects = new Set<number>();

  constructor(private readonly link: Link<unknown>) {}

  /** Looks once; resolves with how many messages it put back. */
  async look(): Promise<number> {
    const { jsm, stream, durable, subject } = this.link;
    const [info, consumer] = await Promise.all([jsm.streams.info(stream), jsm.consumers.info(stream, durable)]);
    const done = consumer.num_ack_pending === 0 ? consumer.delivered.stream_seq : consumer.ack_floor.stream_seq;
    const previous = this.suspects;
    this.suspects = new Set();
    let requeued = 0;
    for (let seq = info.state.first_seq; info.state.messages > 0 && seq <= done; seq++) {
      const stored = await jsm.streams.getMessage(stream, { seq, next_by_subj: subject } as MsgRequest).catch(() => null);
      if (stored === null || stored.seq > done) break;
      seq = stored.seq;
      if (!previous.has(seq)) {
        this.suspects.add(seq);
        continue;
      }
      // Its place first (the link may be full); only the receiver whose delete succeeds puts it back.
      if (!(await jsm.streams.deleteMessage(stream, seq, false).catch(() => false))) continue;
      await putBack(this.link, stored);
      requeued++;
    }
    return requeued;
  }
}

/** Publishes `stored` again with its id, until the server stores it (a producer may take the freed place first). */
async function putBack(link: Link<unknown>, stored: StoredMsg): Promise<void> {
  const headers = natsTransport().headers();
  for (const [key, values] of stored.header ?? []) if (key !== 'Nats-Msg-Id') for (const value of values) headers.append(key, value);
  headers.set(ID, stored.header?.get(ID) || stored.header?.get('Nats-Msg-Id') || `${link.stream}-${stored.seq}`);
  for (;;) {
    try {
      // Its own msgID: a retry whose confirmation was lost is dropped by the server.
      await link.js.publish(link.subject, stored.data, { headers, msgID: `${link.stream}-${stored.seq}.requeued` });
      return;
    } catch (error) {
      if (link.connection.isClosed() || (definite(error) && apiCode(error) !== MAXIMUM_MESSAGES_EXCEEDED)) throw error;
      await new Promise((resolve) => setTimeout(resolve, link.config.creditInterval));
    }
  }
}
