import { Flow } from '../src/flow/demand.js';
import { parseOptions } from '../src/flow/options.js';
import { StageStats } from '../src/flow/stats.js';
import { InvalidOptionsError } from '../src/core/errors.js';
import type { Traced } from '../src/core/trace.js';
export type { StageContext, WorkResult, Work, ShedEvent, FailureEvent } from '../src/flow/work.js';
import type { Work } from '../src/flow/work.js';
export type { StageOptions, StageOperator } from './stage/options.js';
import { StageConfig, stageOptionsSchema, type StageOptions, type StageOperator } from './stage/options.js';
import { ignoresContext, isAsyncFunction } from './stage/work-kind.js';
import { FastStageRun, fastPathsOn } from './stage/fast-paths.js';
import { UnorderedRun } from './stage/unordered.js';

let unnamed = 0;

/**
 * Turns `work` into a pipeline stage with a bounded buffer and pull-based backpressure.
 *
 * Elements wait in a buffer of `capacity`; up to `concurrency` of them are worked on
 * at once. With the default `pause` policy the stage asks its producer for more only
 * while it has room, so memory stays bounded whatever the speeds. Every output is a
 * `Traced<O>`: the value and its trace (ids, per-stage timing when sampled).
 *
 * ```
 * source:  --a--b--c--d--|
 * stage(x => x.toUpperCase())
 * output:  --A--B--C--D--|      (each a Traced<string>)
 * ```
 *
 * `work` may return a value, a Promise, an Observable or an AsyncIterable (one input,
 * many outputs: a token stream, paused while downstream has no demand). Its
 * `context.signal` aborts on unsubscribe, kill switch or timeout.
 *
 * ## Example
 * ```ts
 * fromIterable(prompts).pipe(
 *   stage(embed, { name: 'embed', concurrency: 4, capacity: 64 }),
 *   stage((vector, { signal }) => index.search(vector, { signal }), { name: 'retrieve' }),
 * );
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see Policy for the overflow policies; `KillSwitch`; `StageStats`.
 */
export function stage<I, O>(work: Work<I, O>, options: StageOptions<I> = {}): StageOperator<I, O> {
  if (typeof work !== 'function') {
    throw new InvalidOptionsError(`stage${options?.name ? ` "${options.name}"` : ''}`, [
      { path: 'work', message: `must be a function (value, context) => result, got ${describeValue(work)}` },
    ]);
  }
  const parsed = parseOptions(stageOptionsSchema(), options, `stage${options?.name ? ` "${options.name}"` : ''} options`);
  const fast = fastPathsOn();
  const name = parsed.name ?? (work.name && work.name !== 'work' ? work.name : `stage-${++unnamed}`);
  const config = new StageConfig(parsed, name, !fast || !ignoresContext(work), fast && isAsyncFunction(work), fast);
  const stats = parsed.stats ?? new StageStats();
  return (source) =>
    new Flow<Traced<O>>((outlet) =>
      config.ordered ? new FastStageRun(source, work, config, stats, outlet) : new UnorderedRun(source, work, config, stats, outlet),
    );
}

function describeValue(value: unknown): string {
  return value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value;
}
