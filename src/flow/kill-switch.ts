/**
 * A handle that ends the stages it is given to, from outside the pipeline (Akka's
 * KillSwitch). `shutdown()` stops taking input and lets buffered and in-flight work
 * finish, then completes; `abort(reason)` aborts in-flight work, fails what is
 * buffered, and errors the stream with `reason`.
 *
 * ## Example
 * ```ts
 * const kill = new KillSwitch();
 * source.pipe(stage(work, { name: 'embed', killSwitch: kill })).subscribe(...);
 * process.once('SIGTERM', () => kill.shutdown());
 * ```
 */
export class KillSwitch {
  private readonly listeners = new Set<(event: KillEvent) => void>();
  private fired: KillEvent | undefined;

  /** `armed` until told, then `shutdown` or `aborted`. */
  get state(): 'armed' | 'shutdown' | 'aborted' {
    return this.fired === undefined ? 'armed' : this.fired.kind === 'shutdown' ? 'shutdown' : 'aborted';
  }

  /** Completes every flow the switch controls: sources stop, what is in flight drains. */
  shutdown(): void {
    this.fire({ kind: 'shutdown' });
  }

  /** Errors every flow the switch controls with `reason`, at once: in-flight work is cancelled. */
  abort(reason: unknown = new Error('aborted by kill switch')): void {
    this.fire({ kind: 'abort', reason });
  }

  /** Registers a listener; returns its removal. A listener added after firing runs at once. */
  listen(listener: (event: KillEvent) => void): () => void {
    if (this.fired) {
      listener(this.fired);
      return () => {};
    }
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Listeners currently registered (a stage removes its own when it ends). */
  get listenerCount(): number {
    return this.listeners.size;
  }

  private fire(event: KillEvent): void {
    if (this.fired) return;
    this.fired = event;
    for (const listener of [...this.listeners]) listener(event);
    this.listeners.clear();
  }
}

/** What a `KillSwitch` was told: a graceful `shutdown` or an `abort` with its reason. */
export type KillEvent = { kind: 'shutdown' } | { kind: 'abort'; reason: unknown };
