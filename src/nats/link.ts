/**
 * A link: one edge of a pipeline carried by NATS JetStream. Its stream is a work queue bounded on
 * the server (`max_msgs` = capacity, `discard: new`), so a producer that outruns the bound is
 * refused rather than buffered; its one durable pull consumer is shared by every receiver, so
 * the receivers split the work.
 */
import type * as z from 'zod';
import { isZodSchema, lazySchema, type Holds, type SchemaMatches } from '../core/zod.js';
import type { NatsConnection } from '@nats-io/nats-core';
import type { JetStreamClient, JetStreamManager, StreamConfig, ConsumerConfig } from '@nats-io/jetstream';
import { natsJetstream } from '../core/peers.js';
import { SluiceError, errorMessage } from '../core/errors.js';
import { parseOptions, positiveInt } from '../flow/options.js';

/** A link could not be opened or used: the NATS server, its JetStream, or the link's stream or consumer. */
export class LinkError extends SluiceError {
  readonly link: string;
  constructor(code: LinkErrorCode, link: string, message: string, hint: string, cause?: unknown) {
    super(code, `link "${link}": ${message}`, { hint, cause });
    this.link = link;
  }
}

/** The `code` of a `LinkError`. */
export type LinkErrorCode =
  /** The server has JetStream off, or the account has none. */
  | 'JETSTREAM_UNAVAILABLE'
  /** The link's stream exists with settings that contradict the options. */
  | 'LINK_CONFLICT'
  /** The server refused a request of the link (its stream or consumer, a publish). */
  | 'LINK_REFUSED'
  /** The connection closed while the link was in use. */
  | 'LINK_DISCONNECTED'
  /** An element the link's schema does not admit was offered to a producer. */
  | 'INVALID_MESSAGE'
  /** A producer's schema admits values the link's receivers refuse (or a receiver's refuses what producers send). */
  | 'SCHEMA_MISMATCH';

/** @internal The one check of a link's options; `LinkOptions` is its input, written out. */
export const linkOptionsSchema = lazySchema((z) =>
  z
    .object({
      /** The link's name: its stream is `SLUICE_<name>`, its subject `sluice.link.<name>`. */
      name: z.string().regex(/^[A-Za-z0-9_-]+$/, { error: 'name must be letters, digits, "-" or "_"' }),
      /** Messages the link holds at most, sent and not yet acknowledged (enforced by the server too). */
      capacity: positiveInt('capacity').default(256),
      /** How long a receiver may hold a message before the server delivers it again (ms). */
      ackWait: z.number().positive({ error: 'ackWait must be > 0 ms' }).default(30_000),
      /** Deliveries of one message that ends unsettled (its worker stopped, or it was held past its time) before it is dead-lettered; after the first, each is worked on alone. */
      maxDeliver: positiveInt('maxDeliver').default(5),
      /** Publishes awaiting their acknowledgement from the server, at most. */
      publishWindow: positiveInt('publishWindow').default(32),
      /** How often a producer without credit asks the server for the link's backlog (ms). */
      creditInterval: z.number().positive({ error: 'creditInterval must be > 0 ms' }).default(250),
      /** How long a receiver's pull waits for messages before it is renewed (ms). */
      pullExpires: z.number().min(1000, { error: 'pullExpires must be ≥ 1000 ms (the server refuses less)' }).default(5_000),
      /** Servers of a JetStream cluster that keep a copy of the link's streams (1, 3 or 5; at most the cluster's size). */
      replicas: z.union([z.literal(1), z.literal(3), z.literal(5)], { error: 'replicas must be 1, 3 or 5' }).default(1),
      /** How long the ids of settled messages are kept to drop copies (ms): the stream's duplicate window and the settled-ids log's age. */
      dedupWindow: z.number().min(1_000, { error: 'dedupWindow must be ≥ 1000 ms' }).default(120_000),
      /** Dead letters the link keeps, newest first (its dead-letter stream's `max_msgs`; older ones are dropped). */
      deadLetters: positiveInt('deadLetters').default(10_000),
      /** What a message must be: receivers dead-letter one that is not, producers refuse to send one. */
      schema: z.custom<z.ZodType>(isZodSchema, { error: 'schema must be a zod schema' }).optional(),
    })
    .strict(),
);

/** Options of `openLink`: the link's name, its capacity, delivery settings and the element schema. */
export interface LinkOptions<T = unknown> {
  /** The link's name: its stream is `SLUICE_<name>`, its subject `sluice.link.<name>`. */
  name: string;
  /** Messages the link holds at most, sent and not yet acknowledged (enforced by the server too). Default 256. */
  capacity?: number;
  /** How long a receiver may hold a message before the server delivers it again (ms). Default 30 000. */
  ackWait?: number;
  /** Deliveries of one message that ends unsettled before it is dead-lettered; after the first, each is worked on alone. Default 5. */
  maxDeliver?: number;
  /** Publishes awaiting their acknowledgement from the server, at most. Default 32. */
  publishWindow?: number;
  /** How often a producer without credit asks the server for the link's backlog (ms). Default 250. */
  creditInterval?: number;
  /** How long a receiver's pull waits for messages before it is renewed (ms, at least 1000). Default 5000. */
  pullExpires?: number;
  /** Servers of a JetStream cluster that keep a copy of the link's streams (at most the cluster's size). Default 1. */
  replicas?: 1 | 3 | 5;
  /** How long the ids of settled messages are kept to drop copies (ms): the stream's duplicate window. Default 120 000. */
  dedupWindow?: number;
  /** Dead letters the link keeps, newest first; older ones are dropped. Default 10 000. */
  deadLetters?: number;
  /** What a message must be: receivers dead-letter one that is not, producers refuse to send one. */
  schema?: z.ZodType<T>;
}

/** A link's options after validation, defaults filled in. */
export interface LinkConfig {
  /** The link's name: its stream is `SLUICE_<name>`, its subject `sluice.link.<name>`. */
  name: string;
  /** Messages the link holds at most, sent and not yet acknowledged (enforced by the server too). */
  capacity: number;
  /** How long a receiver may hold a message before the server delivers it again (ms). */
  ackWait: number;
  /** Deliveries of one message that ends unsettled before it is dead-lettered; after the first, each is worked on alone. */
  maxDeliver: number;
  /** Publishes awaiting their acknowledgement from the server, at most. */
  publishWindow: number;
  /** How often a producer without credit asks the server for the link's backlog (ms). */
  creditInterval: number;
  /** How long a receiver's pull waits for messages before it is renewed (ms, at least 1000). */
  pullExpires: number;
  /** Servers of a JetStream cluster that keep a copy of the link's streams (at most the cluster's size). */
  replicas: 1 | 3 | 5;
  /** How long the ids of settled messages are kept to drop copies (ms): the stream's duplicate window. */
  dedupWindow: number;
  /** Dead letters the link keeps, newest first; older ones are dropped. */
  deadLetters: number;
  /** What a message must be, if the link checks its messages. */
  schema?: z.ZodType;
}

/** @internal Fails to compile when the option types and the schema part ways. */
export type LinkOptionsInStep = [
  Holds<SchemaMatches<LinkOptions, z.input<ReturnType<typeof linkOptionsSchema>>>>,
  Holds<SchemaMatches<LinkConfig, z.output<ReturnType<typeof linkOptionsSchema>>>>,
];

/** An opened link: where its messages go, and the clients to reach them. `T` is what its schema admits. */
export interface Link<T = unknown> {
  readonly config: LinkConfig;
  readonly schema: z.ZodType<T> | undefined;
  readonly stream: string;
  readonly subject: string;
  /** The stream that keeps messages a receiver gave up on, each with its reason. */
  readonly deadStream: string;
  readonly deadSubject: string;
  /** The stream of trial records of messages delivered again (`trials.ts`), one per message on `<trialsSubject>.<seq>`. */
  readonly trialsStream: string;
  readonly trialsSubject: string;
  /** The stream of ids of messages receivers are done with (`settled-log.ts`), and its subject. */
  readonly settledStream: string;
  readonly settledSubject: string;
  /** Where receivers tell producers that room was freed (core NATS, not stored). */
  readonly creditSubject: string;
  readonly durable: string;
  readonly connection: NatsConnection;
  readonly js: JetStreamClient;
  readonly jsm: JetStreamManager;
}

/** JetStream's API error code for a stream refusing a message over `max_msgs` with `discard: new`. */
export const MAXIMUM_MESSAGES_EXCEEDED = 10077;
const STREAM_NOT_FOUND = 10059;
const TRIAL_RECORD_AGE_NS = 24 * 3_600 * 1e9;

/**
 * Opens a link over `connection`, creating its stream and consumer if they do not exist and
 * checking them if they do. Invalid options throw `InvalidOptionsError`; a server without
 * JetStream, or a stream whose bound contradicts `capacity`, a `LinkError`.
 */
export async function openLink<T = unknown>(connection: NatsConnection, options: LinkOptions<T>): Promise<Link<T>> {
  const config = parseOptions(linkOptionsSchema(), options, 'openLink options');
  const { jetstreamManager, jetstream, RetentionPolicy, DiscardPolicy, AckPolicy } = natsJetstream();
  const name = config.name;
  let jsm: JetStreamManager;
  try {
    jsm = await jetstreamManager(connection);
  } catch (error) {
    throw new LinkError(
      'JETSTREAM_UNAVAILABLE',
      name,
      'the server has no JetStream.',
      'Start nats-server with -js (or enable JetStream for the account).',
      error,
    );
  }
  const stream = `SLUICE_${name}`;
  const subject = `sluice.link.${name}`;
  const durable = `${name}-receivers`;
  const wanted: Partial<StreamConfig> & { name: string } = {
    name: stream,
    subjects: [subject],
    retention: RetentionPolicy.Workqueue,
    max_msgs: config.capacity,
    discard: DiscardPolicy.New,
    num_replicas: config.replicas,
    duplicate_window: config.dedupWindow * 1_000_000,
  };
  const existing = await jsm.streams.info(stream).catch((error: unknown) => {
    if (apiCode(error) === STREAM_NOT_FOUND) return undefined;
    throw refused(name, `its stream ${stream} could not be read`, error);
  });
  if (existing === undefined) {
    await jsm.streams.add(wanted).catch((error: unknown) => {
      throw refused(name, `its stream ${stream} could not be created`, error);
    });
  } else if (
    existing.config.max_msgs !== config.capacity ||
    existing.config.retention !== RetentionPolicy.Workqueue ||
    existing.config.discard !== DiscardPolicy.New
  ) {
    throw new LinkError(
      'LINK_CONFLICT',
      name,
      `its stream ${stream} exists with max_msgs ${existing.config.max_msgs}, retention ${existing.config.retention}, discard ${existing.config.discard}; the options ask for ${config.capacity}, workqueue, new.`,
      'Open the link with the capacity it was made with, or delete the stream (nats stream rm) to make it again.',
    );
  }
  if (existing !== undefined && existing.config.duplicate_window !== wanted.duplicate_window) {
    await jsm.streams.update(stream, { ...existing.config, duplicate_window: wanted.duplicate_window }).catch((error: unknown) => {
      throw refused(name, `its stream ${stream}'s duplicate window could not be set`, error);
    });
  }
  // No limit of deliveries on the server: a count that blames the messages beside one that kills its
  // worker as much as that one. Receivers judge messages delivered again (trials.ts) and give up.
  const consumer: Partial<ConsumerConfig> = {
    durable_name: durable,
    ack_policy: AckPolicy.Explicit,
    ack_wait: config.ackWait * 1_000_000,
    max_deliver: -1,
    max_ack_pending: config.capacity,
  };
  await jsm.consumers
    .add(stream, consumer)
    .catch(() => jsm.consumers.update(stream, durable, { ack_wait: consumer.ack_wait, max_deliver: -1, max_ack_pending: config.capacity }))
    .catch((error: unknown) => {
      throw refused(name, `its consumer ${durable} could not be created (it may exist with other settings)`, error);
    });
  const deadStream = `SLUICE_${name}_DEAD`;
  const deadSubject = `sluice.dead.${name}`;
  const dead: Partial<StreamConfig> & { name: string } = {
    name: deadStream,
    subjects: [deadSubject],
    retention: RetentionPolicy.Limits,
    max_msgs: config.deadLetters,
    discard: DiscardPolicy.Old,
    num_replicas: config.replicas,
  };
  // The ids of settled messages (settled-log.ts): kept as long as the server drops copies, and after its restarts.
  const settled: Partial<StreamConfig> & { name: string } = {
    name: `SLUICE_${name}_SETTLED`,
    subjects: [`sluice.settled.${name}`],
    retention: RetentionPolicy.Limits,
    max_age: config.dedupWindow * 1_000_000,
    num_replicas: config.replicas,
  };
  const trials: Partial<StreamConfig> & { name: string } = {
    name: `SLUICE_${name}_TRIALS`,
    subjects: [`sluice.trial.${name}.*`],
    retention: RetentionPolicy.Limits,
    max_msgs_per_subject: 1,
    // Records are removed when their message is settled; one left over by a crash goes after a day.
    max_age: TRIAL_RECORD_AGE_NS,
    num_replicas: config.replicas,
  };
  // add, else update: the same config twice is accepted; a changed bound is applied.
  for (const [config, what] of [
    [dead, `its dead-letter stream ${deadStream}`],
    [trials, `its trials stream ${trials.name}`],
    [settled, `its settled-ids stream ${settled.name}`],
  ] as const)
    await jsm.streams
      .add(config)
      .catch(() => jsm.streams.update(config.name, config))
      .catch((error: unknown) => {
        throw refused(name, `${what} could not be created`, error);
      });
  return {
    config,
    schema: config.schema as z.ZodType<T> | undefined,
    stream,
    subject,
    deadStream,
    deadSubject,
    trialsStream: trials.name,
    settledStream: settled.name,
    settledSubject: `sluice.settled.${name}`,
    trialsSubject: `sluice.trial.${name}`,
    creditSubject: `${subject}.credit`,
    durable,
    connection,
    js: jetstream(connection),
    jsm,
  };
}

/** The JetStream API error code of `error`, if it is one. */
export function apiCode(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | undefined)?.code;
  if (typeof code === 'number') return code;
  const api = (error as { api_error?: { err_code?: unknown } } | undefined)?.api_error?.err_code;
  return typeof api === 'number' ? api : undefined;
}

/**
 * Whether `error` is the server's definite answer (a JetStream API error: no such stream or
 * consumer, a bound) rather than a passing state (a timeout, no responders while the server
 * restarts or the client reconnects), which is worth trying again.
 */
export function definite(error: unknown): boolean {
  const code = apiCode(error);
  return code !== undefined && code >= 10_000;
}

/** The connection closed for good (the client stopped reconnecting): the link cannot go on. */
export function disconnected(link: string, what: string, hint: string, cause: unknown): LinkError {
  return new LinkError('LINK_DISCONNECTED', link, what, hint, cause);
}

export function refused(link: string, what: string, cause: unknown): LinkError {
  const detail = errorMessage(cause);
  return new LinkError('LINK_REFUSED', link, `${what}: ${detail}.`, 'Check the server (nats-server -js) and the link options.', cause);
}
