/**
 * Every model a server serves answers through a long-lived pipeline behind one shared door: the
 * server's `Intake` (a bounded queue by priority class, shed lowest class first). `sluice-rag`
 * builds its own stages on that door; every other model (the character LM, a user's decoder, an
 * upstream's model, a guarded or redacting wrapper) gets a pipeline of one `stream` stage that
 * holds at most `streams` generations at once; a request leaves the door's queue only when one
 * can start, so all waiting is there, in class order.
 */
import { defer, finalize } from 'rxjs';
import { StageStats } from '../flow/stats.js';
import type { PriorityClass } from '../core/vocabulary.js';
import type { ModelWorker } from '../ai/inference/worker.js';
import { Intake } from '../ai/pipelines/intake.js';
import { streamStage, pipelineWorker, type PipelineJob, type PipelineWorker } from '../ai/pipelines/pipeline-worker.js';

/** How the shared pipelines are sized. */
export interface PipelineLimits {
  /** Requests waiting at the door, across models. */
  readonly maxQueue: number;
  /** Generations streaming at once, per model. */
  readonly streams: number;
  /** Each tenant's class when a request names none. */
  readonly tenants?: Readonly<Record<string, PriorityClass>>;
}

/** The door, its pipelines, and their counters. */
export interface ServedPipelines {
  readonly intake: Intake;
  readonly workers: Record<string, ModelWorker>;
  /** Counters to export: `intake`, and `stream` when a model got a pipeline here. */
  readonly stages: Record<string, StageStats>;
  /** Stops taking requests (503); those waiting still go through. */
  drain(): void;
  /** Ends the pipelines built here. */
  close(): void;
}

/** The default door: 64 requests per core waiting, at least 64. */
export function defaultMaxQueue(cores: number): number {
  return Math.max(64, 64 * cores);
}

/** Puts every worker behind `intake` (made here unless given): `shared` names those that are pipelines on it already. */
export function servedPipelines(
  workers: Readonly<Record<string, ModelWorker>>,
  limits: PipelineLimits,
  shared: ReadonlySet<string> = new Set(),
  intake = new Intake({ maxQueue: limits.maxQueue, ...(limits.tenants !== undefined && { tenants: limits.tenants }) }),
): ServedPipelines {
  const stream = new StageStats();
  const built: PipelineWorker[] = [];
  const served: Record<string, ModelWorker> = {};
  for (const [name, worker] of Object.entries(workers)) {
    if (shared.has(name)) {
      served[name] = worker;
      continue;
    }
    let streaming = 0;
    // Counted from subscription to its end however it ends (a stream never subscribed holds no slot).
    const started = (job: PipelineJob) =>
      defer(() => {
        streaming++;
        return worker.generate(job.request, job.options);
      }).pipe(
        finalize(() => {
          streaming--;
          intake.wake(name);
        }),
      );
    const piped = pipelineWorker({
      name,
      intake,
      pipeline: (jobs) =>
        jobs.pipe(
          streamStage(started, {
            name: 'stream',
            concurrency: limits.streams,
            // A request arrives only as a slot frees (the gate below) and starts at once.
            capacity: 1,
            stats: stream,
          }),
        ),
      ...(worker.stages !== undefined && { stages: worker.stages }),
      ...(worker.contextLength !== undefined && { contextLength: worker.contextLength }),
      ...(worker.passthrough !== undefined && { passthrough: worker.passthrough }),
    });
    intake.gate(name, () => streaming < limits.streams);
    built.push(piped);
    served[name] = piped;
  }
  return {
    intake,
    workers: served,
    stages: built.length > 0 ? { intake: intake.stats, stream } : { intake: intake.stats },
    drain: () => intake.drain(),
    close: () => {
      for (const worker of built) worker.close();
    },
  };
}
