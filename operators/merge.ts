import { merge, type Observable, type ObservedValueOf } from 'rxjs';

/**
 * Merges sources into one stream that keeps their demand: the consumer's demand
 * paces every Flow among the sources, so merging two generators into a slow stage
 * pulls no more from them together than the stage can hold.
 *
 * ```
 * a:      --1-----3-----|
 * b:      -----2-----4--|
 * mergeFlows(a, b)
 * output: --1--2--3--4--|
 * ```
 *
 * RxJS `merge` already does this, for a reason worth knowing: it subscribes every
 * source synchronously while it is itself being subscribed, inside the consumer's
 * link scope, so each Flow links to the consumer itself and asks it before every
 * element (see `src/flow/demand.ts`). What breaks it is deferring a subscription out
 * of that window: `merge(a, b, c, 1)` (a concurrency limit) or `concat(a, b)`
 * subscribe later sources when earlier ones complete, outside any scope, and those
 * then run without demand. `mergeFlows` takes sources only — no concurrency, no
 * scheduler — so every source is subscribed at once and stays paced.
 *
 * Completes when every source has completed; errors with the first error and
 * unsubscribes the rest; unsubscribing it unsubscribes every source.
 *
 * ## Example
 * ```ts
 * mergeFlows(fromIterable(backlog), fromAsyncIterable(live)).pipe(
 *   stage(embed, { name: 'embed', capacity: 32 }),   // both sources paused while embed is full
 * );
 * ```
 *
 * @see partition, balance and broadcast, whose lanes' outputs are merged the same way.
 */
export function mergeFlows<A extends readonly Observable<unknown>[]>(...sources: A): Observable<ObservedValueOf<A[number]>> {
  return merge(...(sources as readonly Observable<ObservedValueOf<A[number]>>[]));
}
