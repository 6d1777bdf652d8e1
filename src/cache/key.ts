import { createHash } from 'node:crypto';
import { SluiceError } from '../core/errors.js';

/** A chat message, as most model APIs take it. */
export interface ChatMessage {
  readonly role: string;
  readonly content: string;
}

/** What identifies an answer: the model, what it is asked, and how it generates. */
export interface CacheRequest {
  readonly model: string;
  readonly prompt?: string;
  readonly messages?: readonly ChatMessage[];
  /** Generation parameters (temperature, max tokens, stop sequences...). Their order does not matter. */
  readonly params?: Readonly<Record<string, unknown>>;
}

/**
 * JSON with object keys sorted at every depth, so two objects with the same
 * content serialise identically whatever order their keys were written in.
 * Follows `JSON.stringify` for what JSON cannot hold (an `undefined` property is
 * left out, a non-finite number becomes `null`); functions, symbols and bigints
 * are refused, since two different ones would otherwise collide.
 *
 * ## Example
 * ```ts
 * canonicalJson({ b: 1, a: [true, null] }); // '{"a":[true,null],"b":1}'
 * ```
 */
export function canonicalJson(value: unknown): string {
  return write(value, new Set());
}

function write(value: unknown, seen: Set<object>): string {
  if (value === null) return 'null';
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return JSON.stringify(value);
    case 'number':
      return Number.isFinite(value) ? JSON.stringify(value) : 'null';
    case 'object':
      break;
    default:
      throw new SluiceError('CACHE_KEY', `A cache key cannot be made from a ${typeof value}.`, {
        hint: 'Key on plain data (strings, numbers, arrays, objects), or pass `key` to compute it yourself.',
      });
  }
  const object = value as object;
  if (seen.has(object)) throw new SluiceError('CACHE_KEY', 'A cache key cannot be made from a cyclic value.', { hint: 'Pass `key` to compute it yourself.' });
  seen.add(object);
  let out: string;
  if (typeof (object as { toJSON?: unknown }).toJSON === 'function') {
    out = write((object as { toJSON(): unknown }).toJSON(), seen);
  } else if (Array.isArray(object)) {
    out = `[${object.map((item: unknown) => (item === undefined ? 'null' : write(item, seen))).join(',')}]`;
  } else if (ArrayBuffer.isView(object)) {
    out = write(Array.from(object as unknown as ArrayLike<number>), seen);
  } else {
    const record = object as Record<string, unknown>;
    const parts: string[] = [];
    for (const key of Object.keys(record).sort()) {
      const item = record[key];
      if (item === undefined || typeof item === 'function' || typeof item === 'symbol') continue;
      parts.push(`${JSON.stringify(key)}:${write(item, seen)}`);
    }
    out = `{${parts.join(',')}}`;
  }
  seen.delete(object);
  return out;
}

/**
 * A stable key for any plain value: the sha-256 (hex) of its canonical JSON.
 *
 * ## Example
 * ```ts
 * hashKey({ temperature: 0, top_p: 1 }) === hashKey({ top_p: 1, temperature: 0 }); // true
 * ```
 */
export function hashKey(value: unknown): string {
  return createHash('sha256').update(canonicalJson(value)).digest('hex');
}

/**
 * The response-cache key of a request: the sha-256 of the model, the prompt or
 * messages, and the generation parameters. Other fields of the object (a request
 * id, a user id, a deadline) are left out on purpose: they do not change the
 * answer, and keying on them would make every request a miss.
 *
 * ## Example
 * ```ts
 * const a = cacheKey({ model: 'llama-3-8b', prompt: 'Hi', params: { temperature: 0, max_tokens: 64 } });
 * const b = cacheKey({ model: 'llama-3-8b', prompt: 'Hi', params: { max_tokens: 64, temperature: 0 } });
 * a === b; // true: parameter order does not matter
 * ```
 */
export function cacheKey(request: CacheRequest): string {
  return hashKey({ model: request.model, prompt: request.prompt, messages: request.messages, params: request.params ?? {} });
}

/**
 * Whether `value` has the shape of a {@link CacheRequest} (a model and a prompt or messages).
 *
 * ## Example
 * ```ts
 * isCacheRequest({ model: 'm', prompt: 'Hi' }); // true
 * isCacheRequest('Hi');                          // false: keyed by its whole value instead
 * ```
 */
export function isCacheRequest(value: unknown): value is CacheRequest {
  if (typeof value !== 'object' || value === null) return false;
  const request = value as Partial<CacheRequest>;
  return typeof request.model === 'string' && (typeof request.prompt === 'string' || Array.isArray(request.messages));
}
