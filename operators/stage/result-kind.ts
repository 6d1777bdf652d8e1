/** What a stage's work returned, as a number the hot path can switch on. */
import { Observable } from 'rxjs';

export const PLAIN = 0;
export const PROMISE = 1;
export const OBSERVABLE = 2;
export const ASYNC_ITERABLE = 3;

/** What `call` returns when the work threw (and was reported). */
export const THREW: unique symbol = Symbol('threw');
/** Whether `call` failed; the `typeof` test first keeps V8 from comparing a number with a symbol the slow way. */
export const threw = (result: unknown): result is typeof THREW => typeof result === 'symbol' && result === THREW;

/** Small enough to inline on the hot path: a primitive needs no lookups. */
export function kindOf(result: unknown): number {
  return result === null || (typeof result !== 'object' && typeof result !== 'function') ? PLAIN : objectKind(result);
}

function objectKind(result: unknown): number {
  if (typeof (result as PromiseLike<unknown>).then === 'function') return PROMISE;
  if (result instanceof Observable) return OBSERVABLE;
  if (typeof (result as AsyncIterable<unknown>)[Symbol.asyncIterator] === 'function') return ASYNC_ITERABLE;
  return PLAIN;
}
