/**
 * A `ModelWorker` that answers every request through one long-lived pipeline: `generate` queues
 * the request in an `Intake`, the pipeline (built once, subscribed at the first request) takes it
 * through its shared stages, and its last stage hands the request its own token stream, which
 * the client reads at its own pace. Queues, batches and sheds are then the server's, not one
 * request's: what the inspector and `/metrics` show is the load.
 */
import { Observable, tap, type MonoTypeOperatorFunction, type Subscription } from 'rxjs';
import { AbortedError, SluiceError } from '../../core/errors.js';
import { lazySchema } from '../../core/zod.js';
import { traced, type Traced } from '../../core/trace.js';
import type { Flow } from '../../flow/demand.js';
import { handoff, type HandoffHandle } from '../../flow/handoff.js';
import { functionSchema, parseOptions, positiveInt } from '../../flow/options.js';
import { StageStats } from '../../flow/stats.js';
import { stage, type StageOperator } from '../../../operators/stage.js';
import {
  complete,
  generateRequest,
  type Completion,
  type GenerateOptions,
  type GenerateRequest,
  type InferOptions,
  type ModelWorker,
  type Token,
} from '../inference/worker.js';
import { Intake, type PriorityClass } from './intake.js';

/** One request inside a shared pipeline. */
export interface PipelineJob {
  readonly request: GenerateRequest;
  /** The caller's options; `signal` is the job's own (aborted when the client leaves). */
  readonly options: GenerateOptions & { readonly signal: AbortSignal };
  /** Streams `tokens` to the client; resolves once that stream ended, however it ended. */
  stream(tokens: Observable<Token>): Promise<void>;
  /** Ends the request with `err` before any token (a stage failed it). */
  fail(err: unknown): void;
}

/** Options of `pipelineWorker`. */
export interface PipelineWorkerOptions {
  /** The model name clients ask for. */
  readonly name: string;
  /** The door it shares with the server's other pipelines. */
  readonly intake: Intake;
  /**
   * Builds the pipeline once: requests in (traced, each with its caller's trace), and every
   * request must end in `job.stream(...)` or `job.fail(...)` — `streamStage` does the first.
   * What it emits is drained and dropped.
   */
  readonly pipeline: (jobs: Flow<Traced<PipelineJob>>) => Observable<unknown>;
  /** Its stages' names, when they count each request themselves (see `ModelWorker.stages`). */
  readonly stages?: readonly string[];
  /** See `ModelWorker.contextLength`. */
  readonly contextLength?: number;
  /** See `ModelWorker.passthrough`. */
  readonly passthrough?: boolean;
}

const optionsSchema = lazySchema((z) =>
  z.strictObject({
    name: z.string({ error: 'name must be a string' }).min(1, { error: 'name must not be empty' }),
    intake: z.instanceof(Intake, { error: 'intake must be an Intake' }),
    pipeline: functionSchema<PipelineWorkerOptions['pipeline']>(),
    stages: z.array(z.string()).optional(),
    contextLength: positiveInt('contextLength').optional(),
    passthrough: z.boolean().optional(),
  }),
);

/** A worker over one shared pipeline; `close()` ends it. */
export interface PipelineWorker extends ModelWorker<GenerateRequest, Completion> {
  /** Requests inside the pipeline now (past the intake, not yet ended). */
  readonly active: number;
  /** Stops the pipeline; requests inside it end with `SHUTDOWN`. */
  close(): void;
}

/**
 * Builds the worker. Each request's priority class is `options.priority` (the server derives it
 * from `service_tier` and the tenant), else `default`.
 *
 * ## Example
 * ```ts
 * const intake = new Intake({ maxQueue: 64 });
 * const lm = await CharLmWorker.load('models/charlm.onnx');
 * const shared = pipelineWorker({
 *   name: 'charlm',
 *   intake,
 *   pipeline: (jobs) => jobs.pipe(streamStage((job) => lm.generate(job.request, job.options), { concurrency: 16 })),
 * });
 * shared.generate(generateRequest({ prompt: 'The stage', max_tokens: 40 })).subscribe((t) => process.stdout.write(t.text));
 * ```
 */
export function pipelineWorker(options: PipelineWorkerOptions): PipelineWorker {
  const config = parseOptions(optionsSchema(), options, 'pipelineWorker options');
  const { intake, name } = config;
  intake.lane(name); // the lane exists before the first offer
  const active = new Set<HandoffHandle<Token>>();
  let running: Subscription | undefined;
  let closed = false;

  const stopped = (err: unknown) => {
    running = undefined;
    const error = new SluiceError('PIPELINE_STOPPED', `the pipeline of "${name}" stopped`, { cause: err });
    for (const handle of [...active]) handle.fail(error);
  };
  const start = () => {
    if (running !== undefined || closed) return;
    const sub = options.pipeline(intake.lane<PipelineJob>(name)).subscribe({
      error: (err: unknown) => stopped(err),
      complete: () => stopped(undefined),
    });
    if (!sub.closed) running ??= sub;
  };

  const generate = (request: GenerateRequest, generateOptions: GenerateOptions = {}): Flow<Token> => {
    const valid = generateRequest(request);
    return handoff<Token>((handle) => {
      if (closed) throw new SluiceError('SHUTDOWN', `"${name}" is shut down.`);
      start();
      const controller = new AbortController();
      const signal = generateOptions.signal === undefined ? controller.signal : AbortSignal.any([controller.signal, generateOptions.signal]);
      const trace = generateOptions.trace ?? traced(null).trace;
      let entered = false;
      const job: PipelineJob = {
        request: valid,
        options: { ...generateOptions, signal, trace },
        stream: (tokens) =>
          new Promise<void>((resolve) => {
            const ended = () => {
              active.delete(handle);
              resolve();
            };
            if (handle.closed) return ended();
            handle.attach(tokens.pipe(endsAfter(ended)));
            if (handle.closed) ended();
          }),
        fail: (err) => {
          active.delete(handle);
          handle.fail(err);
        },
      };
      active.add(handle); // before the offer: a pipeline may take the request, and fail, inside it
      const withdraw = intake.offer<PipelineJob>(name, {
        job,
        tenant: generateOptions.tenant ?? 'anonymous',
        priority: generateOptions.priority,
        trace,
        refuse: (err) => job.fail(err),
      });
      entered = true;
      if (handle.closed) active.delete(handle);
      // The caller's abort ends the request wherever it is: waiting in the intake, in a stage, or streaming.
      const caller = generateOptions.signal;
      const aborted = () => {
        withdraw();
        job.fail(abortReason(caller!, name));
      };
      if (caller?.aborted) aborted();
      else caller?.addEventListener('abort', aborted, { once: true });
      return () => {
        active.delete(handle);
        caller?.removeEventListener('abort', aborted);
        controller.abort(new AbortedError(name, 'the client left'));
        if (entered) withdraw();
      };
    });
  };

  return {
    name,
    ...(config.stages !== undefined && { stages: config.stages }),
    ...(config.contextLength !== undefined && { contextLength: config.contextLength }),
    ...(config.passthrough !== undefined && { passthrough: config.passthrough }),
    get active() {
      return active.size;
    },
    generate,
    infer: (request: GenerateRequest, inferOptions: InferOptions = {}) => complete((onDone) => generate(request, { ...inferOptions, onDone })),
    close() {
      closed = true;
      running?.unsubscribe();
      stopped(new SluiceError('SHUTDOWN', `"${name}" is shut down.`));
    },
  };
}

/** Options of `streamStage`: the stage's name, its concurrent streams, its buffer and counters. */
export interface StreamStageOptions {
  /** Default `generate`. */
  readonly name?: string;
  /** Streams running at once. Default 16. */
  readonly concurrency?: number;
  /** Requests waiting for a stream slot. Default 16. */
  readonly capacity?: number;
  readonly stats?: StageStats;
}

/**
 * The last stage of a shared pipeline: starts each request's token stream and holds one of
 * `concurrency` slots until the client has read it to its end (or left). A stage failing a
 * request here (the model refused it) ends that request alone.
 */
export function streamStage<T extends { readonly job: PipelineJob } | PipelineJob>(
  tokens: (value: T) => Observable<Token>,
  options: StreamStageOptions = {},
): StageOperator<T, T> {
  const stats = options.stats ?? new StageStats();
  // Its outputs are the tokens it streams, so the inspector reads tokens/s while requests are still open.
  const counted = tap<Token>(() => stats.emittedCount++);
  return stage(
    async (value: T) => {
      const job = jobOf(value);
      if (job.options.signal.aborted) return value;
      await job.stream(tokens(value).pipe(counted));
      return value;
    },
    {
      name: options.name ?? 'generate',
      concurrency: options.concurrency ?? 16,
      capacity: options.capacity ?? 16,
      ordered: false,
      errorPolicy: 'skip',
      onFailure: ({ value, error }) => jobOf(value).fail(error),
      stats,
    },
  );
}

/**
 * Calls `ended` when the stream ends however it ends, and passes its terminal on a turn later:
 * the stage holding the request records it (its trace, its counts) before the client hears the end.
 */
function endsAfter<T>(ended: () => void): MonoTypeOperatorFunction<T> {
  return (source) =>
    new Observable<T>((subscriber) => {
      const inner = source.subscribe({
        next: (value) => subscriber.next(value),
        error: (err: unknown) => {
          ended();
          setImmediate(() => subscriber.error(err));
        },
        complete: () => {
          ended();
          setImmediate(() => subscriber.complete());
        },
      });
      return () => {
        inner.unsubscribe();
        ended();
      };
    });
}

/** The error an aborted request ends with: the signal's own `AbortedError`, else one naming the worker. */
function abortReason(signal: AbortSignal, name: string): unknown {
  return signal.reason instanceof AbortedError ? signal.reason : new AbortedError(name, 'aborted by the caller');
}

/** The job a pipeline element carries. */
export function jobOf(value: { readonly job: PipelineJob } | PipelineJob): PipelineJob {
  return 'job' in value ? value.job : value;
}

export type { PriorityClass };
