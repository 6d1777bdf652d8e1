import type { PoolingPlan } from '../models/pooling.js';
import type { Outputs } from './options.js';
import type { WireTensors } from './protocol.js';
import type { ResidentStep } from './resident-kv.js';

/** One `run` or `runBorrowed` call, from submission until it settles. */
export interface Job {
  readonly id: number;
  readonly model: string;
  readonly feeds: WireTensors;
  readonly pooling: PoolingPlan | undefined;
  /** A step over resident KV caches: it runs on `pin`, the worker holding them, and nowhere else. */
  readonly step: ResidentStep | undefined;
  /** The worker (its slot) this job must run on; `undefined`: any. */
  readonly pin: object | undefined;
  readonly transfer: ArrayBuffer[];
  /** Shared feed buffers leased to this job until the worker can no longer read them. */
  leases: readonly SharedArrayBuffer[];
  /** `runBorrowed`'s reader: called on the outputs before the worker runs anything else; the run resolves to what it returns. */
  readonly use: ((outputs: Outputs) => unknown) | undefined;
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: unknown) => void;
  readonly signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
  /** `discarded`: aborted while running; the worker's answer is dropped when it comes. */
  state: 'queued' | 'running' | 'discarded' | 'settled';
  prev: Job | undefined;
  next: Job | undefined;
}

/** The jobs waiting for a worker, oldest first: a list through the jobs themselves, so an aborted job leaves it in O(1). */
export class JobQueue {
  private head: Job | undefined;
  private tail: Job | undefined;
  length = 0;

  push(job: Job): void {
    job.prev = this.tail;
    if (this.tail !== undefined) this.tail.next = job;
    else this.head = job;
    this.tail = job;
    this.length++;
  }

  shift(): Job | undefined {
    const job = this.head;
    if (job !== undefined) this.remove(job);
    return job;
  }

  remove(job: Job): void {
    if (job.prev !== undefined) job.prev.next = job.next;
    else this.head = job.next;
    if (job.next !== undefined) job.next.prev = job.prev;
    else this.tail = job.prev;
    job.prev = job.next = undefined;
    this.length--;
  }

  /** The oldest job `slot` may run: one pinned to it or to no worker. */
  shiftFor(slot: object): Job | undefined {
    for (let job = this.head; job !== undefined; job = job.next) {
      if (job.pin !== undefined && job.pin !== slot) continue;
      this.remove(job);
      return job;
    }
    return undefined;
  }

  /** Removes and returns the jobs pinned to `slot` (its worker died), oldest first. */
  drainPinned(slot: object): Job[] {
    const jobs: Job[] = [];
    for (let job = this.head; job !== undefined; ) {
      const next = job.next;
      if (job.pin === slot) {
        this.remove(job);
        jobs.push(job);
      }
      job = next;
    }
    return jobs;
  }

  /** Empties the queue, returning its jobs oldest first. */
  drain(): Job[] {
    const jobs: Job[] = [];
    for (let job = this.head; job !== undefined; job = job.next) jobs.push(job);
    this.head = this.tail = undefined;
    this.length = 0;
    return jobs;
  }
}
