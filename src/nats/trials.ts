/**
 * Messages delivered again, and whose fault that was. A message comes back when its receiver did
 * not settle it: the receiver died, its pipeline dropped the element — or it was a bystander,
 * held beside a message that killed the process. Delivery counts cannot tell these apart, so the
 * link's consumer delivers without limit and the receivers judge:
 *
 * - a receiver works on at most one such message at a time (a trial), and records the trial on
 *   the server before it starts (stream `SLUICE_<name>_TRIALS`, one record per message);
 * - the next receiver of a message whose record names a holder asks that holder (core NATS)
 *   whether it still holds it: no answer means the holder stopped while the message was its
 *   only trial, "holding" that it kept it unsettled past `ackWait`;
 * - a message whose trials failed `maxDeliver − 1` times is dead-lettered with that reason, so a
 *   message that kills every worker is given up on and the messages beside it never are;
 * - a message given back on purpose (`nak`: a receiver that stops, a shed element) is recorded as
 *   such, and is delivered again without a trial.
 */
import type { Subscription as NatsSubscription } from '@nats-io/nats-core';
import { type Link, apiCode } from './link.js';

/** What a trial record keeps of a message's past deliveries. */
interface TrialRecord {
  /** Trials whose holder stopped (no answer when asked). */
  readonly stopped: number;
  /** Trials whose holder kept it unsettled past `ackWait` (a plain operator dropped it, or work past `maxHold`). */
  readonly unsettled: number;
  /** The receiver working on it now, if a trial is under way. */
  readonly holder?: string;
  /** Its last delivery ended in a deliberate `nak` outside a trial: the next is not one. */
  readonly handedBack?: boolean;
}

/** What to do with a message delivered again. */
export type Verdict =
  | { readonly kind: 'fresh' }
  | { readonly kind: 'trial' }
  | { readonly kind: 'busy' }
  | { readonly kind: 'give-up'; readonly reason: string; readonly code: 'WORKER_STOPPED' | 'MAX_DELIVER' };

const NO_MESSAGE = 10037;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

const receiverSubject = (name: string, id: string): string => `sluice.link.${name}.receiver.${id}`;

/** One receiver's side of the trials of a link. */
export class Trials {
  readonly id = Math.random().toString(36).slice(2, 12);
  private readonly stream: string;
  /** The message tried here now, and the record its trial wrote: one at a time. */
  private slot: { readonly seq: number; readonly record: TrialRecord } | undefined;
  private readonly answering: NatsSubscription;

  /** `holds(seq)`: whether this receiver still has the message (fetched, or in its pipeline unsettled). */
  constructor(
    private readonly link: Link<unknown>,
    private readonly holds: (seq: number) => boolean,
  ) {
    this.stream = link.trialsStream;
    this.answering = link.connection.subscribe(receiverSubject(link.config.name, this.id), {
      callback: (_error, message) => {
        const seq = Number(decoder.decode(message.data));
        message.respond(encoder.encode(this.holds(seq) ? 'holding' : 'released'));
      },
    });
  }

  /** The sequence of the message tried here: a receiver tries one at a time. */
  get seq(): number | undefined {
    return this.slot?.seq;
  }

  /**
   * Judges a message delivered again (`deliveries` > 1): `fresh` (its last delivery was handed
   * back on purpose), `give-up` (its trials failed `maxDeliver − 1` times), `trial` (recorded as
   * this receiver's trial: work on it), or `busy` (another trial is under way here: give it back
   * for another receiver). Rejects when the server cannot be read or written: deliver it again later.
   */
  async judge(seq: number): Promise<Verdict> {
    const record = await this.read(seq);
    let stopped = record?.stopped ?? 0;
    let unsettled = record?.unsettled ?? 0;
    if (record?.holder !== undefined) {
      const answer = record.holder === this.id ? (this.holds(seq) ? 'holding' : 'released') : await this.ask(record.holder, seq);
      if (answer === 'stopped') stopped++;
      else if (answer === 'holding') unsettled++;
    } else if (record?.handedBack === true) {
      await this.write(seq, { stopped, unsettled });
      return { kind: 'fresh' };
    }
    const maxDeliver = this.link.config.maxDeliver;
    if (stopped + unsettled >= maxDeliver - 1) return giveUp(stopped, unsettled, maxDeliver);
    if (this.slot !== undefined) return { kind: 'busy' };
    const slot = { seq, record: { stopped, unsettled, holder: this.id } };
    this.slot = slot;
    try {
      await this.write(seq, slot.record);
    } catch (error) {
      if (this.slot === slot) this.slot = undefined;
      throw error;
    }
    return { kind: 'trial' };
  }

  /** The message was settled for good (acknowledged, dead-lettered): its record goes. */
  settled(seq: number): void {
    this.release(seq);
    this.link.jsm.streams.purge(this.stream, { filter: this.subjectOf(seq) }).catch(() => {}); // a record left over expires with the stream's max_age
  }

  /**
   * The message is about to be given back on purpose (`nak`): a trial is recorded as not under way
   * (its next delivery is tried again, not blamed); a message outside a trial as handed back.
   * Written before the `nak`, on the same connection, so the next receiver reads it.
   */
  givenBack(seq: number): void {
    const trial = this.slot?.seq === seq ? this.slot.record : undefined;
    this.release(seq);
    const record: TrialRecord = trial === undefined ? { stopped: 0, unsettled: 0, handedBack: true } : { stopped: trial.stopped, unsettled: trial.unsettled };
    this.write(seq, record).catch(() => {}); // lost: the next delivery is tried alone, never wrongly blamed
  }

  /** The server has delivered the trial's message again by now (held past its time): this receiver may try another. */
  expired(seq: number): void {
    this.release(seq);
  }

  private release(seq: number): void {
    if (this.slot?.seq === seq) this.slot = undefined;
  }

  close(): void {
    this.answering.unsubscribe();
  }

  private subjectOf(seq: number): string {
    return `${this.link.trialsSubject}.${seq}`;
  }

  private async read(seq: number): Promise<TrialRecord | undefined> {
    try {
      const stored = await this.link.jsm.streams.getMessage(this.stream, { last_by_subj: this.subjectOf(seq) });
      return stored === null ? undefined : (stored.json<TrialRecord>() as TrialRecord);
    } catch (error) {
      if (apiCode(error) === NO_MESSAGE) return undefined;
      throw error;
    }
  }

  private async write(seq: number, record: TrialRecord): Promise<void> {
    await this.link.js.publish(this.subjectOf(seq), JSON.stringify(record));
  }

  /** Asks the holder of a trial whether it still holds the message; no answer in time: it stopped. */
  private async ask(holder: string, seq: number): Promise<'holding' | 'released' | 'stopped'> {
    try {
      const answer = await this.link.connection.request(receiverSubject(this.link.config.name, holder), encoder.encode(String(seq)), {
        timeout: Math.max(1_000, 4 * this.link.config.creditInterval),
      });
      return decoder.decode(answer.data) === 'holding' ? 'holding' : 'released';
    } catch {
      return 'stopped'; // no responders (its connection is gone) or no answer in time
    }
  }
}

function giveUp(stopped: number, unsettled: number, maxDeliver: number): Verdict {
  if (stopped + unsettled === 0) return { kind: 'give-up', reason: `delivered again, and maxDeliver is ${maxDeliver}`, code: 'MAX_DELIVER' };
  const causes: string[] = [];
  if (stopped > 0) causes.push(`its worker stopped while working on it alone ${times(stopped)}: does it kill its worker?`);
  if (unsettled > 0)
    causes.push(
      `it was not settled while worked on alone ${times(unsettled)} (held past ackWait, or past maxHold with keepAlive): was it dropped by a plain operator?`,
    );
  return { kind: 'give-up', reason: causes.join('; '), code: unsettled === 0 ? 'WORKER_STOPPED' : 'MAX_DELIVER' };
}

const times = (n: number): string => (n === 1 ? 'once' : `${n} times`);
