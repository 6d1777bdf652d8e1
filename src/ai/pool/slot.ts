import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { findUp } from '../../core/package-files.js';
import type { Job } from './job-queue.js';
import type { WorkerInit } from './protocol.js';
import type { ResidentHeld } from './resident-kv.js';

/** What one worker thread is doing. */
export interface WorkerStats {
  readonly threadId: number;
  readonly state: 'starting' | 'idle' | 'busy' | 'closing';
  /** `session.run` calls the worker itself reports having started. */
  readonly runs: number;
  /** Sequences whose KV caches this worker holds (`runResident`), and their bytes. */
  readonly resident: ResidentHeld;
}

/** One worker thread and the job it runs; the pool never gives a worker a second job before the first is answered. */
export class Slot {
  state: WorkerStats['state'] = 'starting';
  runs = 0;
  resident: ResidentHeld = { sequences: 0, bytes: 0 };
  job: Job | undefined;
  /** Shared memory this worker writes borrowed outputs into; created with its first borrowed job, and sent with it. */
  arena: SharedArrayBuffer | undefined;
  /** Set by an `error` event, reported when the thread exits. */
  lastError: unknown;
  readonly exited: Promise<void>;
  private markExited!: () => void;

  /** Kept: `worker.threadId` reads -1 once the thread has exited, and crash reports need it after that. */
  readonly threadId: number;

  constructor(readonly worker: Worker) {
    this.threadId = worker.threadId;
    this.exited = new Promise((resolve) => (this.markExited = resolve));
  }

  onExit(): void {
    this.markExited();
  }
}

/**
 * A worker on `worker-thread.ts` through tsx when this module runs from source (a
 * `.ts` URL), else on the compiled `worker-thread.js`. The tsx hooks that
 * `--import tsx` installs on the main thread are not ready when a worker's entry
 * module loads (Node 20), so the worker registers tsx itself before importing.
 */
export function startWorker(workerData: WorkerInit): Worker {
  const here = import.meta.url;
  if (here.endsWith('.ts')) {
    const entry = new URL('./worker-thread.ts', here).href;
    const tsx = import.meta.resolve('tsx/esm/api');
    const bootstrap = `import(${JSON.stringify(tsx)}).then(({ register }) => { register(); return import(${JSON.stringify(entry)}); });`;
    return new Worker(bootstrap, { eval: true, workerData });
  }
  // From dist/ this module may sit in a shared chunk: the worker entry is found from the package root.
  const entry = findUp(here, 'dist/src/ai/pool/worker-thread.js') ?? fileURLToPath(new URL('./worker-thread.js', here));
  return new Worker(entry, { workerData });
}
