/**
 * The clock stage timings are read from: `performance.now()`'s time line (milliseconds since
 * the process began, fractional), read through `process.hrtime()`.
 *
 * Both read libuv's `uv_hrtime()`, but `performance.now()` first checks its receiver's brand on
 * every call, which costs more than the read (figures: docs/internals/stage-hot-path.md).
 */
import { performance } from 'node:perf_hooks';

const hrtime = process.hrtime;

function hrtimeMs(): number {
  const time = hrtime();
  return time[0] * 1e3 + time[1] / 1e6;
}

/** Added to `hrtimeMs()` to land on `performance.now()`'s origin (both count from the same clock). */
const offset = performance.now() - hrtimeMs();

/** Monotonic milliseconds on `performance.now()`'s time line. */
export function monotonicNow(): number {
  return hrtimeMs() + offset;
}
