/**
 * Stage worker processes (stage-worker.ts) kept at a count: one that dies is replaced and counted.
 * Used by the crash tests and bench/nats-chaos.ts.
 */
import { type ChildScript, startScript } from './child-script.js';

export interface WorkerPool {
  /** Resolves once the first `count` workers are ready. */
  readonly ready: Promise<void>;
  /** Workers that died (and were replaced) so far. */
  readonly deaths: number;
  /** Kills every worker (SIGKILL); none is replaced after. */
  close(): void;
}

/** `args()`: stage-worker.ts's arguments for each worker started. */
export function workerPool(args: () => string[], count: number): WorkerPool {
  const workers = new Set<ChildScript>();
  let deaths = 0;
  let closed = false;
  const start = async (): Promise<void> => {
    const worker = await startScript('./stage-worker.ts', args());
    workers.add(worker);
    worker.child.once('exit', () => {
      workers.delete(worker);
      if (closed) return;
      deaths++;
      void start();
    });
  };
  return {
    ready: Promise.all(Array.from({ length: count }, start)).then(() => {}),
    get deaths() {
      return deaths;
    },
    close() {
      closed = true;
      for (const worker of workers) worker.child.kill('SIGKILL');
    },
  };
}
