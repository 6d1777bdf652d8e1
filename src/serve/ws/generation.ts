/**
 * What a WebSocket request hands its worker (`GenerateOptions`): the trace, the stage, the
 * `onDone` report, and an `AbortSignal` made only when the worker reads it. A signal costs
 * ~750 bytes that live as long as the request, and a model that never looks at it (a
 * synchronous generator) should not pay them; aborting one nobody read is nothing to do.
 */
import type { GenerateOptions, GenerationDone } from '../../ai/inference/worker.js';
import type { TraceContext } from '../../core/trace.js';

export class GenerationContext implements GenerateOptions {
  private controller: AbortController | undefined;
  /** Set by `abort` before anyone read the signal: a signal read later is born aborted. */
  private reason: { value: unknown } | undefined;
  /** The worker's report, once it ended. */
  done: GenerationDone | undefined;
  /** An own property, not a method: a worker may pass it on to another (`{ onDone: options.onDone }`). Bound, not an arrow: no context to keep. */
  readonly onDone: (done: GenerationDone) => void = this.report.bind(this);

  constructor(
    readonly trace: TraceContext,
    readonly stage: string,
    /** An own property: a wrapper that spreads the options passes it on. */
    readonly tenant?: string,
  ) {}

  /** Made on first read. A getter, as `StageContext.signal` is: a wrapper worker passes it on by name, not by spreading the options. */
  get signal(): AbortSignal {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.reason !== undefined) this.controller.abort(this.reason.value);
    }
    return this.controller.signal;
  }

  private report(done: GenerationDone): void {
    this.done = done;
  }

  abort(reason: unknown): void {
    if (this.reason !== undefined) return;
    this.reason = { value: reason };
    this.controller?.abort(reason);
  }
}
