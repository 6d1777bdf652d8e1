import { SluiceError } from '../../core/errors.js';

/** `run()` on a pool that is closing or closed, or a queued job the closing pool will never start. */
export class PoolClosedError extends SluiceError {
  constructor(
    readonly pool: string,
    queued: boolean,
  ) {
    super('POOL_CLOSED', queued ? `Inference pool "${pool}" closed before this queued job started.` : `Inference pool "${pool}" is closed.`, {
      hint: 'Close the pool only after the pipelines using it have completed, or create a new pool.',
    });
  }
}

/** Every worker was busy and `maxQueue` jobs were already waiting. */
export class PoolQueueFullError extends SluiceError {
  constructor(
    readonly pool: string,
    readonly maxQueue: number,
  ) {
    super('POOL_QUEUE_FULL', `Inference pool "${pool}" has ${maxQueue} job(s) queued (maxQueue) and every worker busy.`, {
      hint: 'Put the pool behind a stage (infer()) so demand, not a queue, bounds the work; or raise maxQueue or the pool size.',
    });
  }
}

/** The worker thread running a job exited or threw; the pool replaces it. */
export class WorkerCrashedError extends SluiceError {
  constructor(
    readonly pool: string,
    readonly threadId: number,
    reason: string,
    cause?: unknown,
  ) {
    super('WORKER_CRASHED', `Inference pool "${pool}": worker thread ${threadId} died while running this job (${reason}).`, {
      hint: 'The pool starts a replacement; retry the job. Repeated crashes point at the model or at memory limits.',
      cause,
    });
  }
}

/** onnxruntime rejected a run: wrong input names, types or shapes, or a failing kernel. */
export class InferenceFailedError extends SluiceError {
  constructor(
    readonly pool: string,
    readonly model: string,
    reason: string,
  ) {
    super('INFERENCE_FAILED', `Inference pool "${pool}", model "${model}": ${reason}`, {
      hint: 'Check the feeds against the model inputs (pool.describe(model).inputNames) and their dtypes and dims.',
    });
  }
}

/** `run(feeds, { model })` named a model the pool was not created with (or named none in a pool of several). */
export class UnknownModelError extends SluiceError {
  constructor(
    readonly pool: string,
    readonly model: string | undefined,
    readonly known: readonly string[],
  ) {
    super(
      'UNKNOWN_MODEL',
      model === undefined
        ? `Inference pool "${pool}" holds ${known.length} models (${known.join(', ')}): name one with { model }.`
        : `Inference pool "${pool}" has no model "${model}" (it holds ${known.join(', ')}).`,
      { hint: 'Pass one of the names given in InferencePool.create({ models }).' },
    );
  }
}

/** `runBorrowed`'s reader returned something that would outlive the borrowed outputs (a Promise, or a view into them). */
export class BorrowedOutputsError extends SluiceError {
  constructor(
    readonly pool: string,
    reason: string,
  ) {
    super('BORROWED_OUTPUTS', `Inference pool "${pool}": ${reason}.`, {
      hint: 'Borrowed outputs live in memory the worker reuses for its next run: read them synchronously and return copies (numbers, row.slice()).',
    });
  }
}
