/**
 * Floors: what any pipeline of the same shape pays before a library adds anything. Kept
 * apart from bench/throughput.ts so that bench/count.ts can bundle it without the library.
 */
import type { Checked } from './throughput.js';

const identityAsync = async (x: number): Promise<number> => x;

/**
 * The floor for async stages: per element per stage, one call of an `async` function and one
 * `.then` on its promise, with handlers made once, `inFlight` elements at a time. Any pipeline
 * whose stages call such work and wait for it pays this in V8's promise machinery; what a
 * library adds (demand, buffering, order, traces) comes on top.
 */
export function promiseHops(inFlight: number, stages: number) {
  return (n: number): Promise<Checked> =>
    new Promise((resolve, reject) => {
      let started = 0;
      let count = 0;
      let sum = 0;
      const handlers: ((x: number) => void)[] = [];
      for (let i = 0; i < stages; i++) {
        handlers.push(
          i < stages - 1
            ? (x) => void identityAsync(x).then(handlers[i + 1], reject)
            : (x) => {
                count++;
                sum += x;
                if (started < n) void identityAsync(started++).then(handlers[0], reject);
                else if (count === n) resolve({ count, sum });
              },
        );
      }
      while (started < Math.min(inFlight, n)) void identityAsync(started++).then(handlers[0], reject);
      if (n === 0) resolve({ count, sum });
    });
}
