/**
 * Errors an OpenAI-compatible server sends inside a stream that began with HTTP 200, in the
 * shapes servers use: OpenAI's `{"error": {message, type, param, code}}`, vLLM's
 * `{"object": "error", message, type, param, code: 400}`, TGI's `{"error": "text", "error_type"}`,
 * and any payload of an SSE `event: error`. Each becomes a `ProviderError` carrying the HTTP
 * status it stands for, so a stream's error is judged as the same answer sent as a status would be.
 */
import { ProviderError } from './errors.js';

/** OpenAI's error `type`s and `code`s (and the names vLLM, TGI and Anthropic use), lower-cased, by the HTTP status they come with. */
const STATUS_OF_NAME: Readonly<Record<string, number>> = {
  invalid_request_error: 400,
  badrequesterror: 400,
  bad_request: 400,
  validation: 400,
  validation_error: 400,
  context_length_exceeded: 400,
  invalid_value: 400,
  invalid_prompt: 400,
  unsupported_parameter: 400,
  authentication_error: 401,
  authenticationerror: 401,
  invalid_api_key: 401,
  unauthorized: 401,
  permission_error: 403,
  permissiondeniederror: 403,
  permission_denied: 403,
  forbidden: 403,
  not_found_error: 404,
  notfounderror: 404,
  model_not_found: 404,
  not_found: 404,
  unprocessableentityerror: 422,
  unprocessable_entity: 422,
  rate_limit_exceeded: 429,
  rate_limit_error: 429,
  ratelimiterror: 429,
  insufficient_quota: 429,
  too_many_requests: 429,
  requests: 429,
  tokens: 429,
  server_error: 500,
  internal_error: 500,
  internalservererror: 500,
  api_error: 500,
  overloaded_error: 503,
  overloaded: 503,
  service_unavailable: 503,
  timeout: 504,
};

/**
 * A payload read as an in-stream error, or undefined when it is not one. `json` is the payload
 * parsed, undefined when it is not JSON; `event` the SSE event type (`message` by default).
 */
export function inStreamError(json: unknown, event: string, payload: string): ProviderError | undefined {
  if (typeof json !== 'object' || json === null || Array.isArray(json)) {
    // Only an `event: error` may carry plain text.
    return event === 'error' ? providerError({ message: typeof json === 'string' ? json : payload.trim() || 'an error event without a message' }) : undefined;
  }
  const object = json as Record<string, unknown>;
  if (typeof object.error === 'object' && object.error !== null) return providerError(object.error as Record<string, unknown>, object);
  if (typeof object.error === 'string') return providerError({ message: object.error, type: object.error_type }, object);
  if (object.object === 'error' || event === 'error') return providerError(object);
  return undefined;
}

/** `fields` (the error object) and `outer` (the payload around it, for a status given beside it). */
function providerError(fields: Readonly<Record<string, unknown>>, outer: Readonly<Record<string, unknown>> = {}): ProviderError {
  const text = (value: unknown) => (typeof value === 'string' && value.length > 0 ? value : undefined);
  const message = text(fields.message) ?? text(fields.detail) ?? JSON.stringify(fields).slice(0, 500);
  const type = text(fields.type);
  // A numeric code is a status (vLLM, llama.cpp); a string code is OpenAI's name of the error.
  const code = statusOf(fields.code) === undefined ? text(fields.code) : undefined;
  const param = text(fields.param);
  const status =
    statusOf(fields.code) ?? statusOf(fields.status) ?? statusOf(fields.status_code) ?? statusOf(outer.status) ?? nameStatus(code) ?? nameStatus(type) ?? 500;
  const body = JSON.stringify({ error: { message, type: type ?? null, param: param ?? null, code: code ?? null } });
  return new ProviderError(status, type, message, body);
}

function statusOf(value: unknown): number | undefined {
  const status = typeof value === 'string' && /^\d{3}$/.test(value) ? Number(value) : value;
  return typeof status === 'number' && Number.isInteger(status) && status >= 400 && status <= 599 ? status : undefined;
}

function nameStatus(name: string | undefined): number | undefined {
  return name === undefined ? undefined : STATUS_OF_NAME[name.toLowerCase()];
}
