/**
 * How late the event loop runs, sampled by a timer: while it lags, requests pile up unseen in the
 * kernel and the loop, in front of any queue the server counts, so the HTTP door refuses new
 * completions until the loop catches up (admitted streams keep the loop they need).
 */
import { performance } from 'node:perf_hooks';

/** The sampling period, ms: short enough to see a burst, long enough to cost nothing. */
const EVERY = 10;

/** A sampler of the event loop's lateness; `stop()` ends it. */
export class LoopLag {
  /** ms: rises at once to a late tick, halves towards each punctual one. */
  private lagMs = 0;
  private timer: NodeJS.Timeout | undefined;

  constructor() {
    this.tick();
  }

  /** How late the loop has been running lately, ms. */
  get lag(): number {
    return this.lagMs;
  }

  stop(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }

  private tick(): void {
    const due = performance.now() + EVERY;
    // Unref'd: the sampler never keeps a process alive.
    this.timer = setTimeout(() => {
      const late = Math.max(0, performance.now() - due);
      this.lagMs = late >= this.lagMs ? late : (this.lagMs + late) / 2;
      if (this.timer !== undefined) this.tick();
    }, EVERY).unref();
  }
}
