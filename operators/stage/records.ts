/**
 * A stage's trace records: what a sampled element's trace keeps about its passage through the
 * stage (queue wait, service, time paused for demand, retries, conflated peers, or why it was shed).
 * Only sampled elements are recorded; every function here is given a sampled element's context.
 */
import type { ShedReason } from '../../src/flow/options.js';
import type { Kept, TraceContext } from '../../src/core/trace.js';
import type { Task } from './task.js';

/** Retry wrappers note their attempts; a record carries them so timing and retries read together. */
export function retriesOf(trace: TraceContext, stage: string): number {
  const notes = trace.notes;
  if (notes === undefined) return 0;
  const retries = notes[`${stage}.retries`];
  return typeof retries === 'number' ? retries : 0;
}

/** The record of an element that leaves the stage now, in one piece. */
export function record(trace: TraceContext, stage: string, queueWait: number, service: number, paused: number, conflated: number): void {
  const retries = retriesOf(trace, stage);
  trace.keep(stage, queueWait, service, paused, retries, conflated, undefined);
}

/** Keeps a streaming task's record in stage order: placed as its first output leaves, with the times so far. */
export function placeRecord<I, O>(task: Task<I, O>, stage: string, now: number): void {
  const trace = task.trace as TraceContext;
  const retries = retriesOf(trace, stage);
  task.kept = trace.keep(stage, task.queueWait, now - task.startedAt - task.paused, task.paused, retries, task.merged, undefined);
}

/** The record of a task whose work ended at `end`: written now, or the placed one completed. Once per task. */
export function finishRecord<I, O>(task: Task<I, O>, stage: string, end: number): void {
  task.recorded = true;
  const trace = task.trace as TraceContext;
  const kept = task.kept;
  if (kept === undefined) {
    record(trace, stage, task.queueWait, end - task.startedAt - task.paused, task.paused, task.merged);
  } else {
    task.kept = undefined;
    trace.amend(kept, end - task.startedAt - task.paused, task.paused, retriesOf(trace, stage));
  }
  trace.lastExit = end;
}

/** The record of a shed element: a record of its own, or a streaming task's placed record marked shed. */
export function recordShed(trace: TraceContext, stage: string, reason: ShedReason, kept: Kept | undefined): void {
  if (kept === undefined) trace.keep(stage, 0, 0, 0, 0, 0, reason);
  else trace.amend(kept, kept.service, kept.paused, kept.retries, reason);
}
