/**
 * `asFlow(observable)`: a chain of operators over Flows (say `fromIterable(x).pipe(stage(...), map(...))`)
 * as one `Flow`, for APIs that take a Flow — a `ModelWorker.generate` built from a
 * pipeline, for instance. Demand passes through: the chain's last stage is asked for
 * an element only while this Flow's consumer wants one. A Flow is returned as it is.
 */
import { asyncScheduler, type Observable, type SchedulerLike } from 'rxjs';
import { Flow } from '../flow/demand.js';
import { Relay } from './relay.js';

/**
 * Wraps `source` as a Flow. `source` is subscribed once per subscription of the result
 * (it is cold if `source` is); an Observable that cannot be paused is relayed as it
 * pushes, like any plain Observable between stages.
 *
 * ## Example
 * ```ts
 * const worker: TokenWorker = {
 *   name: 'rag',
 *   generate: (request, options) =>
 *     asFlow(fromIterable([question(request)]).pipe(embed(...), retrieve(...), assemble(...), stage((p, c) => lm.generate(toRequest(p), c)), map((t) => t.value))),
 * };
 * ```
 */
export function asFlow<T>(source: Observable<T>, scheduler: SchedulerLike = asyncScheduler): Flow<T> {
  if (source instanceof Flow) return source as Flow<T>;
  return new Flow<T>((outlet) => {
    const relay = new Relay<T>(() => outlet.wants(), scheduler, {
      output: (value) => outlet.next(value),
      error: (err) => outlet.error(err),
      complete: () => outlet.complete(),
    });
    return {
      start: () => relay.start(() => source),
      pull: () => relay.resume(),
      cancel: () => relay.close(),
    };
  });
}
