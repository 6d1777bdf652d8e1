/**
 * What each upstream of a gateway did, for the inspector and `Gateway.upstreams()`: attempts sent
 * to it and in flight now, their failures by code, retries, requests passed on to the next
 * upstream, and calls its open circuit refused. Counted by `observed`, a pass-through wrapper of a
 * work function whose Flow keeps its demand (it relays as the breaker does).
 */
import type { SchedulerLike } from 'rxjs';
import { AbortedError, SluiceError } from '../../core/errors.js';
import { Flow, type Outlet, type Producer } from '../../flow/demand.js';
import type { StageContext } from '../../flow/work.js';
import type { CircuitState } from '../../resilience/breaker.js';
import { Relay, type StreamWork } from '../../resilience/relay.js';
import { HttpStatusError } from './errors.js';

/** One upstream now, as the inspector shows it. */
export interface UpstreamView {
  readonly name: string;
  readonly circuit: CircuitState;
  /** Attempts sent to it (retries included). */
  readonly attempts: number;
  /** Attempts running now. */
  readonly inFlight: number;
  readonly succeeded: number;
  /** Failed attempts by code: `HTTP_<status>`, `NETWORK`, or a sluice error's code (`STREAM_TIMEOUT`...). */
  readonly failures: Readonly<Record<string, number>>;
  /** Attempts after a request's first on this upstream. */
  readonly retries: number;
  /** Requests that failed here and were passed on to the next upstream. */
  readonly fallbacks: number;
  /** Calls refused at once by its open circuit. */
  readonly rejected: number;
}

/** Counters of one upstream. */
export class UpstreamStats {
  attempts = 0;
  inFlight = 0;
  succeeded = 0;
  retries = 0;
  fallbacks = 0;
  rejected = 0;
  /** Bounded: the codes are HTTP statuses and a few error codes. */
  readonly failures = new Map<string, number>();

  failed(error: unknown): void {
    const code = failureCode(error);
    this.failures.set(code, (this.failures.get(code) ?? 0) + 1);
  }

  view(name: string, circuit: CircuitState): UpstreamView {
    const { attempts, inFlight, succeeded, retries, fallbacks, rejected } = this;
    return { name, circuit, attempts, inFlight, succeeded, failures: Object.fromEntries(this.failures), retries, fallbacks, rejected };
  }
}

/** The code an upstream's failure is counted under. */
export function failureCode(error: unknown): string {
  if (error instanceof HttpStatusError) return `HTTP_${error.status}`;
  if (error instanceof SluiceError) return error.code;
  // fetch reports a refused, reset or unresolvable connection as a TypeError ("fetch failed").
  return error instanceof TypeError ? 'NETWORK' : error instanceof Error ? error.name : 'Error';
}

/** What `observed` reports of each call of a work function. A cancelled call reports only `ended`. */
export interface CallObserver {
  started(): void;
  succeeded(): void;
  failed(error: unknown): void;
  /** After `succeeded`, `failed` or a cancel: once per call. */
  ended(): void;
}

/** `work` with each call reported to `observer`; outputs, errors and demand pass through unchanged. */
export function observed<I, O>(work: StreamWork<I, O>, observer: CallObserver, scheduler: SchedulerLike): StreamWork<I, O> {
  return (value, context) => new Flow<O>((outlet) => new ObservedCall(work, value, context, observer, scheduler, outlet));
}

class ObservedCall<I, O> implements Producer {
  private relay: Relay<O> | undefined;

  constructor(
    private readonly work: StreamWork<I, O>,
    private readonly value: I,
    private readonly context: StageContext,
    private readonly observer: CallObserver,
    private readonly scheduler: SchedulerLike,
    private readonly outlet: Outlet<O>,
  ) {}

  start(): void {
    const observer = this.observer;
    observer.started();
    this.relay = new Relay<O>(() => this.outlet.wants(), this.scheduler, {
      output: (output) => this.outlet.next(output),
      error: (err) => {
        // A call aborted by its caller is not the upstream's failure.
        if (!(err instanceof AbortedError)) observer.failed(err);
        observer.ended();
        this.outlet.error(err);
      },
      complete: () => {
        observer.succeeded();
        observer.ended();
        this.outlet.complete();
      },
    });
    this.relay.start(() => this.work(this.value, this.context));
  }

  pull(): void {
    this.relay?.resume();
  }

  cancel(): void {
    if (this.relay === undefined || this.relay.closed) return;
    this.relay.close();
    this.observer.ended();
  }
}
