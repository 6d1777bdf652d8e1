/**
 * `guardedWorker(worker, { classify })`: the worker, with its requests' questions classified
 * for prompt injection first — the guard of `sluice-rag` in front of any model, an upstream's
 * in gateway mode for instance. A blocked request fails with `GuardBlockedError` before the
 * model is asked anything.
 */
import { map } from 'rxjs';
import { Traced, traced } from '../../core/trace.js';
import type { Flow } from '../../flow/demand.js';
import { fromIterable } from '../../flow/sources.js';
import { StageStats } from '../../flow/stats.js';
import { functionSchema, parseOptions } from '../../flow/options.js';
import { lazySchema } from '../../core/zod.js';
import { stage } from '../../../operators/stage.js';
import { asFlow } from '../../resilience/as-flow.js';
import type { Classifier } from '../models/classifier.js';
import { GUARD_THRESHOLDS } from '../models/guard.js';
import { guard } from '../stages/guard.js';
import {
  complete,
  generateRequest,
  questionOf,
  type Completion,
  type GenerateOptions,
  type GenerateRequest,
  type InferOptions,
  type ModelWorker,
  type Token,
} from '../inference/worker.js';

const guardedSchema = lazySchema((z) =>
  z.object({
    worker: z.object(
      { name: z.string({ error: 'worker.name must be a string' }), generate: functionSchema(), infer: functionSchema() },
      { error: 'must be a ModelWorker' },
    ),
    generateStats: z.instanceof(StageStats, { error: 'generateStats must be a StageStats' }).optional(),
  }),
);

/** Options of `guardedWorker`: the classifier and thresholds a prompt is checked with before generation. */
export interface GuardedWorkerOptions {
  /** Scores a question for prompt injection (e.g. `poolClassifier(pool, tokenizer, { model: 'guard' })`). */
  readonly classify: Classifier;
  /** A score at or above `flag` is noted in the trace, at or above `block` refused. Default 0.5 and 0.8, as `sluice-rag`'s. */
  readonly thresholds?: { readonly flag: number; readonly block: number };
  /** The guard stage's counters, shared by every request. */
  readonly stats?: StageStats;
  /** The counters of the stage behind it that asks the model (`generate`), shared by every request. */
  readonly generateStats?: StageStats;
}

/**
 * Wraps `worker`: each request's question (its prompt, or its last user message) goes through
 * a `guard` stage, then a `generate` stage asks `worker`. The two count every request (the
 * worker's `stages`), so a blocked one counts once, as the guard's failure. Everything else of
 * the worker is kept (its name, and `passthrough` for an upstream's).
 *
 * ## Example
 * ```ts
 * const guarded = guardedWorker(upstream, { classify: poolClassifier(pool, tokenizer, { model: 'guard' }) });
 * ```
 */
export function guardedWorker(worker: ModelWorker<GenerateRequest, Completion>, options: GuardedWorkerOptions): ModelWorker<GenerateRequest, Completion> {
  parseOptions(guardedSchema(), { worker, generateStats: options?.generateStats }, 'guardedWorker');
  // Shared by every request, so an inspector sees one guard and one generate, not a pair per request.
  const generateStats = options.generateStats ?? new StageStats();
  // Made once: its options are checked here, not at the first request.
  const guarding = guard({
    name: 'guard',
    classify: options.classify,
    thresholds: options.thresholds ?? GUARD_THRESHOLDS,
    text: questionOf,
    errorPolicy: 'fail',
    stats: options.stats ?? new StageStats(),
  });
  const generate = (request: GenerateRequest, generateOptions: GenerateOptions = {}): Flow<Token> => {
    const valid = generateRequest(request);
    const first = generateOptions.trace === undefined ? traced(valid) : new Traced(valid, generateOptions.trace);
    return asFlow(
      fromIterable([first]).pipe(
        guarding,
        stage(
          (checked: GenerateRequest, context) =>
            worker.generate(checked, {
              ...generateOptions,
              signal: generateOptions.signal === undefined ? context.signal : AbortSignal.any([context.signal, generateOptions.signal]),
              trace: context.trace,
            }),
          { name: 'generate', stats: generateStats },
        ),
        map((t) => t.value),
      ),
    );
  };
  return {
    name: worker.name,
    ...(worker.passthrough === true && { passthrough: true }),
    stages: ['guard', 'generate'],
    generate,
    infer: (request: GenerateRequest, inferOptions: InferOptions = {}) => complete((onDone) => generate(request, { ...inferOptions, onDone })),
  };
}
