/**
 * A link's contract: each side that opens a link with a schema records the JSON Schema of what
 * it sends (producers: the schema's output) or accepts (receivers: its input) on the server, and
 * checks it against the other side's before any data flows. Receivers must accept everything
 * producers may send; a producer or receiver that would break that is refused with a `LinkError`
 * `SCHEMA_MISMATCH` listing each field at fault.
 *
 * Records live in the stream `SLUICE_CONTRACTS` (one message per link and side, the newest kept),
 * so the check holds across processes and restarts.
 */
import type * as z from 'zod';
import { zod } from '../core/zod.js';
import { type Link, LinkError, apiCode, refused } from './link.js';
import { type JsonSchema, unadmitted } from './schema-subset.js';

/** Which end of a link is asking: the producer or the receiver. */
export type Side = 'producer' | 'receiver';

const STREAM = 'SLUICE_CONTRACTS';
const NO_MESSAGE = 10037;
const STREAM_NOT_FOUND = 10059;

const subjectOf = (link: string, side: Side) => `sluice.contract.${link}.${side}`;

/** What `checkLink` found: each side's recorded JSON Schema, and why they do not fit, if they do not. */
export interface LinkContract {
  readonly producer: JsonSchema | undefined;
  readonly receiver: JsonSchema | undefined;
  /** Empty when receivers accept everything producers may send (or a side has no record). */
  readonly reasons: readonly string[];
}

/** The JSON Schema of what `schema` sends (`producer`: its output) or accepts (`receiver`: its input). */
export function jsonSchemaOf(schema: z.ZodType, side: Side): JsonSchema {
  const { $schema: _draft, ...rest } = zod().toJSONSchema(schema, { target: 'draft-7', io: side === 'receiver' ? 'input' : 'output', unrepresentable: 'any' });
  return rest as JsonSchema;
}

/** Checks this side's schema against the other side's record, then records it. Throws `SCHEMA_MISMATCH`. */
export async function agreeOnContract(link: Link<unknown>, side: Side): Promise<void> {
  if (link.schema === undefined) return;
  await ensureStream(link);
  const own = jsonSchemaOf(link.schema, side);
  const other = await recorded(link, side === 'producer' ? 'receiver' : 'producer');
  if (other !== undefined) {
    const reasons = side === 'producer' ? unadmitted(other, own) : unadmitted(own, other);
    if (reasons.length > 0) throw mismatch(link.config.name, side, reasons);
  }
  await link.js.publish(subjectOf(link.config.name, side), JSON.stringify(own)).catch((error: unknown) => {
    throw refused(link.config.name, 'its contract could not be recorded', error);
  });
}

/** Reads both sides' records of `link` and compares them (nothing is recorded). */
export async function checkLink(link: Link<unknown>): Promise<LinkContract> {
  const [producer, receiver] = await Promise.all([recorded(link, 'producer'), recorded(link, 'receiver')]);
  return { producer, receiver, reasons: producer === undefined || receiver === undefined ? [] : unadmitted(receiver, producer) };
}

function mismatch(link: string, side: Side, reasons: readonly string[]): LinkError {
  const what = side === 'producer' ? "this producer may send values the link's receivers refuse" : "this receiver refuses values the link's producers may send";
  return new LinkError(
    'SCHEMA_MISMATCH',
    link,
    `${what}:\n${reasons.map((reason) => `  - ${reason}`).join('\n')}`,
    'Deploy receivers that accept the new values first, then producers that send them.',
  );
}

async function recorded(link: Link<unknown>, side: Side): Promise<JsonSchema | undefined> {
  try {
    const message = await link.jsm.streams.getMessage(STREAM, { last_by_subj: subjectOf(link.config.name, side) });
    return message === null ? undefined : (message.json<JsonSchema>() as JsonSchema);
  } catch (error) {
    const code = apiCode(error);
    if (code === NO_MESSAGE || code === STREAM_NOT_FOUND) return undefined;
    throw refused(link.config.name, 'its contract could not be read', error);
  }
}

async function ensureStream(link: Link<unknown>): Promise<void> {
  // As many copies as the link's own streams: a worker starting while a node is down must still read the contracts.
  const replicas = link.config.replicas;
  const config = { name: STREAM, subjects: ['sluice.contract.>'], max_msgs_per_subject: 1, num_replicas: replicas };
  const made = await link.jsm.streams.add(config).then(
    () => true,
    (error: unknown) => {
      // Made by another process meanwhile (or already there, perhaps with fewer copies): fine.
      if (apiCode(error) !== 10058) throw refused(link.config.name, `the stream ${STREAM} could not be created`, error);
      return false;
    },
  );
  if (made || replicas === 1) return;
  const info = await link.jsm.streams.info(STREAM);
  if (info.config.num_replicas < replicas) {
    await link.jsm.streams.update(STREAM, { ...info.config, num_replicas: replicas }).catch((error: unknown) => {
      throw refused(link.config.name, `the stream ${STREAM} could not be given ${replicas} replicas`, error);
    });
  }
}
