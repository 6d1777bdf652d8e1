/**
 * Remote generation over a link: what a serving process (the requester) and a worker process
 * say to each other. The request itself goes through the link (stored, redelivered if its worker
 * dies); everything about one request after that goes over core NATS, on two subjects the
 * request names:
 *
 * - `reply` (requester listens): `hello`, a request (a worker took the request; the answer is the
 *   credit; no responders means the requester is gone), `token`s with their index, then one `end`
 *   or `error`;
 * - `reply + ".control"` (the worker listens): `credit` — cumulative, the tokens the requester can
 *   take in all (`granted`) and those it already has (`have`): a worker that took the request
 *   over from a dead one skips what was delivered — and `cancel`.
 *
 * Credit is cumulative and re-sent on a timer, so a lost control message delays, never stalls.
 */
import type * as z from 'zod';
import { lazySchema, type Holds, type SchemaMatches } from '../core/zod.js';
import type { NatsConnection } from '@nats-io/nats-core';
import { type Link, type LinkOptions, openLink } from './link.js';

/** @internal The check of a `RemoteRequest`. */
export const remoteRequestSchema = lazySchema((z) =>
  z.object({
    /** Unique per request: names its subjects and dedups its publish. */
    id: z.string().min(1),
    /** Where the worker sends tokens; `reply + ".control"` is where it listens. */
    reply: z.string().min(1),
    /** A `GenerateRequest` (the worker validates it). Always with a seed, so a restart regenerates the same tokens. */
    request: z.record(z.string(), z.unknown()),
  }),
);
/** A generation request as it crosses a NATS link. */
export interface RemoteRequest {
  /** Unique per request: names its subjects and dedups its publish. */
  id: string;
  /** Where the worker sends tokens; `reply + ".control"` is where it listens. */
  reply: string;
  /** A `GenerateRequest` (the worker validates it). Always with a seed, so a restart regenerates the same tokens. */
  request: Record<string, unknown>;
}
/** @internal Fails to compile when `RemoteRequest` and its schema part ways. */
export type RemoteRequestInStep = Holds<SchemaMatches<RemoteRequest, z.infer<ReturnType<typeof remoteRequestSchema>>>>;

/** @internal */
export const workerMessageSchema = lazySchema((z) =>
  z.discriminatedUnion('type', [
    z.object({ type: z.literal('hello'), attempt: z.number().int().min(1) }),
    z.object({ type: z.literal('token'), index: z.number().int().min(0), text: z.string(), logprob: z.number().optional() }),
    z.object({
      type: z.literal('end'),
      finishReason: z.enum(['stop', 'length', 'abort', 'tool_calls', 'content_filter']),
      usage: z.object({ inputTokens: z.number(), outputTokens: z.number() }).loose(),
    }),
    z.object({
      type: z.literal('error'),
      code: z.string(),
      message: z.string(),
      /** With `CONTEXT_LENGTH_EXCEEDED`: its figures, so the requester raises the same typed error (a client's 400, not a server's 500). */
      context: z
        .object({
          contextLength: z.number().int().min(0),
          promptTokens: z.number().int().min(0),
          completionTokens: z.number().int().min(0).optional(),
          param: z.enum(['messages', 'prompt']),
        })
        .optional(),
    }),
  ]),
);
/** @internal */
export type WorkerMessage = z.infer<ReturnType<typeof workerMessageSchema>>;

/** @internal */
export const controlMessageSchema = lazySchema((z) =>
  z.discriminatedUnion('type', [
    z.object({ type: z.literal('credit'), granted: z.number().int().min(0), have: z.number().int().min(0) }),
    z.object({ type: z.literal('cancel') }),
  ]),
);
/** @internal */
export type ControlMessage = z.infer<ReturnType<typeof controlMessageSchema>>;

export const controlSubject = (reply: string): string => `${reply}.control`;

const decoder = new TextDecoder();

/** Parses a JSON message against `schema`; undefined if it is not one (the caller reports it). @internal */
export function parseMessage<T>(schema: z.ZodType<T>, data: Uint8Array): T | undefined {
  try {
    const result = schema.safeParse(JSON.parse(decoder.decode(data)));
    return result.success ? result.data : undefined;
  } catch {
    return undefined;
  }
}

/** Opens the link requests for a remote model go through (its schema is the request envelope). */
export function openModelLink(connection: NatsConnection, options: Omit<LinkOptions<RemoteRequest>, 'schema'>): Promise<Link<RemoteRequest>> {
  return openLink(connection, { ...options, schema: remoteRequestSchema() });
}
