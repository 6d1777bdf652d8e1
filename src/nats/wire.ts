/**
 * What a link message carries beside its body: the element's trace (W3C `traceparent`, the
 * element's seq, its sampled per-stage records) in headers; and how a message a receiver gave
 * up on is kept, with its reason, in the link's dead-letter stream.
 */
import type { JsMsg } from '@nats-io/jetstream';
import type { MsgHdrs } from '@nats-io/nats-core';
import type { ZodError } from 'zod';
import { SluiceError, errorMessage } from '../core/errors.js';
import type { TraceContext } from '../core/trace.js';
import { natsTransport } from '../core/peers.js';
import type { Link } from './link.js';

export const TRACEPARENT = 'traceparent';
export const SEQ = 'sluice-seq';
export const RECORDS = 'sluice-records';
export const REASON = 'sluice-reason';
export const ORIGIN_SEQ = 'sluice-link-seq';
export const DELIVERIES = 'sluice-deliveries';
/** A message's id for de-duplication when it was put back on its link under a new `Nats-Msg-Id` (`reclaim.ts`). */
export const ID = 'sluice-id';

/** Headers carrying `trace` to the next process (its records only when it is sampled). */
export function traceHeaders(trace: TraceContext): MsgHdrs {
  const headers = natsTransport().headers();
  headers.set(TRACEPARENT, trace.traceparent);
  headers.set(SEQ, String(trace.seq));
  const records = trace.records;
  if (records !== undefined && records.length > 0) headers.set(RECORDS, JSON.stringify(records));
  return headers;
}

/**
 * Publishes `message` to the link's dead-letter stream with `reason`. The id is the message's
 * stream sequence, so a receiver that crashed between this and its `term` and whose successor
 * gives up on the message again stores it once.
 */
export async function deadLetter(link: Link<unknown>, message: Letter, reason: string): Promise<void> {
  const headers = natsTransport().headers();
  if (message.headers !== undefined) for (const [key, values] of message.headers) for (const value of values) headers.append(key, value);
  headers.set(REASON, reason);
  headers.set(ORIGIN_SEQ, String(message.seq));
  headers.set(DELIVERIES, String(message.deliveries));
  await link.js.publish(link.deadSubject, message.data, { msgID: `${link.stream}-${message.seq}`, headers });
}

/** What a dead letter keeps of a message: a received one, or one read back from the stream. */
export interface Letter {
  readonly data: Uint8Array;
  readonly headers: MsgHdrs | undefined;
  readonly seq: number;
  readonly deliveries: number;
}

export function letterOf(message: JsMsg): Letter {
  return { data: message.data, headers: message.headers, seq: message.seq, deliveries: message.info.deliveryCount };
}

/** A reason for the dead-letter stream: a typed error's code and message, or what was thrown. */
export function describe(error: unknown): string {
  if (error instanceof SluiceError) return `${error.code}: ${error.message}`;
  return errorMessage(error);
}

/** A dead letter's reason as a code, for the inspector (the reason's text may quote the message): a typed error's code, else what was thrown's name. */
export function reasonCode(error: unknown): string {
  if (error instanceof SluiceError) return error.code;
  return error instanceof Error ? error.name : 'Error';
}

/** @internal Why a value is not valid for a link's schema: each issue's path and message. */
export function invalidReason(error: ZodError): string {
  return `invalid for the link's schema: ${error.issues.map((issue) => `${issue.path.join('.') || '(root)'}: ${issue.message}`).join('; ')}`;
}
