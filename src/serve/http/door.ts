/**
 * The server's door at the HTTP edge: a completion the intake would refuse is answered 429
 * `server_busy` from its bytes, before its body is parsed or checked. Under overload most
 * requests are refused, so a refusal must cost far less than an admitted request: no JSON parse,
 * no schema, no telemetry span, no error object, a response built once per `Retry-After`.
 */
import { performance } from 'node:perf_hooks';
import type { Intake } from '../../ai/pipelines/intake.js';
import { serverBusy, tierClass } from '../openai-wire.js';
import type { RequestContext } from './context.js';

/** A prepared refusal: its headers and body for one `Retry-After`. */
interface Refusal {
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Buffer;
  readonly message: string;
}

/** What a body's bytes cannot tell without a parse: the request goes the long way. */
const UNCLEAR = Symbol('unclear');

const MODEL = Buffer.from('"model"');
const TIER = Buffer.from('"service_tier"');
/** A `\u` escape could spell a key the byte search misses. */
const ESCAPE = Buffer.from('\\u');
const COLON = 0x3a;
const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/** A log line per refusal under overload is a flood: written synchronously, it stalls the loop that should be refusing. */
const LOG_PER_SECOND = 10;

/** `Retry-After` is 1 s to 60 s (the intake's range): one prepared refusal per value and reason at most. */
const MAX_PREPARED = 120;

/** Refuses, from their bytes, the completions the intake would refuse; one per HTTP edge. */
export class Door {
  private readonly prepared = new Map<number, Refusal>();
  private logSecond = 0;
  private loggedThisSecond = 0;

  constructor(
    private readonly intake: Intake,
    /** The pipeline (the intake's lane) serving a model, undefined for none. */
    private readonly laneOf: (model: string) => string | undefined,
    /** While true (the event loop is late), every completion but a `priority` one is refused. */
    private readonly behind: () => boolean = () => false,
  ) {}

  /**
   * Answers `ctx` 429 when the intake would refuse the request its body asks for (its model's
   * lane, its class): true if it did. A body whose model or tier its bytes do not tell plainly
   * (named twice, escaped, not a string) goes the long way.
   */
  refused(ctx: RequestContext, body: Buffer): boolean {
    if (body.includes(ESCAPE)) return false;
    const model = plainString(body, MODEL);
    const tier = plainString(body, TIER);
    if (typeof model !== 'string' || tier === UNCLEAR) return false;
    const lane = this.laneOf(model);
    if (lane === undefined) return false;
    const priority = tierClass(tier);
    const lagging = priority !== 'high' && this.behind();
    const retryAfter = lagging ? this.intake.turnAwayLagging() : this.intake.turnAway(lane, ctx.tenant ?? 'anonymous', priority);
    if (retryAfter === undefined) return false;
    const refusal = this.refusal(lagging ? 'lagging' : 'queue-full', Math.max(1, Math.ceil(retryAfter / 1000)));
    ctx.res.writeHead(429, refusal.headers);
    ctx.res.end(refusal.body);
    if (this.logged()) ctx.log({ outcome: 'refused', status: 429, error: { code: 'server_busy', message: refusal.message } });
    return true;
  }

  /** Whether this refusal gets a request-log line: `LOG_PER_SECOND` a second at most, /metrics counts the rest. */
  private logged(): boolean {
    const second = Math.floor(performance.now() / 1000);
    if (second !== this.logSecond) {
      this.logSecond = second;
      this.loggedThisSecond = 0;
    }
    return this.loggedThisSecond++ < LOG_PER_SECOND;
  }

  private refusal(reason: 'queue-full' | 'lagging', seconds: number): Refusal {
    const key = reason === 'lagging' ? -seconds : seconds;
    let refusal = this.prepared.get(key);
    if (refusal === undefined) {
      const error = serverBusy(seconds * 1000, reason);
      const body = Buffer.from(error.body());
      refusal = { headers: { ...error.headers, 'content-type': 'application/json', 'content-length': String(body.length) }, body, message: error.message };
      if (this.prepared.size < MAX_PREPARED) this.prepared.set(key, refusal);
    }
    return refusal;
  }
}

/**
 * The value of the key `quotedKey` in a JSON body, read from its bytes: undefined when the key is
 * absent, `UNCLEAR` when it occurs twice or its value is not a string without escapes.
 */
export function plainString(body: Buffer, quotedKey: Buffer): string | undefined | typeof UNCLEAR {
  const at = body.indexOf(quotedKey);
  if (at < 0) return undefined;
  if (body.indexOf(quotedKey, at + quotedKey.length) >= 0) return UNCLEAR;
  let i = skipSpace(body, at + quotedKey.length);
  if (body[i] !== COLON) return UNCLEAR;
  i = skipSpace(body, i + 1);
  if (body[i] !== QUOTE) return UNCLEAR;
  const end = body.indexOf(QUOTE, i + 1);
  if (end < 0 || body.subarray(i + 1, end).includes(BACKSLASH)) return UNCLEAR;
  return body.toString('utf8', i + 1, end);
}

function skipSpace(body: Buffer, from: number): number {
  let i = from;
  while (body[i] === 0x20 || body[i] === 0x0a || body[i] === 0x0d || body[i] === 0x09) i++;
  return i;
}
