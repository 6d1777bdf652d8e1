/**
 * One judgement of an upstream's failure, for HTTP statuses and in-stream errors alike, that
 * the gateway's retries, fallback and breakers and the HTTP edge all follow:
 *
 * | kind | what | retried | next upstream | counts against the circuit |
 * |---|---|---|---|---|
 * | `request` | the client's request is wrong (400, 404, 422, other 4xx) | no | no | no |
 * | `configuration` | the upstream refuses this gateway (401, 403, 407): its key or access is wrong | no | yes | yes |
 * | `transient` | 408, 429, 5xx, silence, a broken stream, the network | yes | yes | yes |
 *
 * A configuration fault counts against its upstream's circuit because every request to that
 * upstream fails alike until its operator fixes it: open, the circuit sends them straight to the
 * next upstream instead of to one that cannot answer anybody.
 */
import { CircuitOpenError, StreamTimeoutError } from '../../resilience/errors.js';
import { HttpStatusError, MalformedEventError } from './errors.js';

export type UpstreamFailure = 'request' | 'configuration' | 'transient';

/** What kind of failure `error` is; see the table above. Anything unknown is `request`: never retried nor counted. */
export function classifyUpstreamFailure(error: unknown): UpstreamFailure {
  if (error instanceof HttpStatusError) return statusFailure(error.status);
  if (error instanceof StreamTimeoutError || error instanceof MalformedEventError || error instanceof CircuitOpenError) return 'transient';
  // fetch reports a refused, reset or unresolvable connection as a TypeError ("fetch failed", "terminated").
  return error instanceof TypeError ? 'transient' : 'request';
}

/** The kind of failure an HTTP status stands for (an upstream's answer, or an in-stream error's equivalent). */
export function statusFailure(status: number): UpstreamFailure {
  if (status === 408 || status === 429 || status >= 500) return 'transient';
  if (status === 401 || status === 403 || status === 407) return 'configuration';
  // Another 4xx is the request's fault; anything below 400 that is not OK means the URL is wrong.
  return status >= 400 ? 'request' : 'configuration';
}

/** Whether an upstream failed, as opposed to the request: counted against its circuit, and passed on to the next upstream. */
export function isUpstreamFault(error: unknown): boolean {
  return classifyUpstreamFailure(error) !== 'request';
}
