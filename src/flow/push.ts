import type * as z from 'zod';
import { lazySchema } from '../core/zod.js';
import type { Observable, Subscription } from 'rxjs';
import { Flow, withLink, type Outlet, type Producer } from './demand.js';
import { OverflowError } from '../core/errors.js';
import { functionSchema, parseOptions, positiveInt, type ShedReason } from './options.js';
import { Ring } from './ring.js';
import { StageStats } from './stats.js';
import { callHook } from './report.js';

/**
 * The policies a push source can have. `pause` is not one of them: a Subject, an
 * event emitter or a plain Observable emits whether or not anyone asked, so the only
 * bounded choices are to shed, merge or fail.
 */
export type PushPolicy = 'shed-incoming' | 'shed-oldest' | 'conflate' | 'fail';

/** Options of `fromPush`: the buffer between a push source and the pipeline's demand. */
export interface PushOptions<T> {
  name?: string;
  /** Elements held while the consumer has no demand. */
  capacity: number;
  policy: PushPolicy;
  /** `conflate`: merges an arriving element into the newest held one. */
  conflate?: (pending: T, incoming: T) => T;
  /** Called with every element the buffer sheds, and why. */
  onShed?: (event: { stage: string; reason: ShedReason; value: T }) => void;
  stats?: StageStats;
}

const pushOptionsSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1).default('push'),
      capacity: positiveInt('capacity'),
      policy: z.enum(['shed-incoming', 'shed-oldest', 'conflate', 'fail'], {
        error: (issue) =>
          issue.input === 'pause'
            ? 'policy "pause" is impossible for a push source: it emits without being asked. Choose "shed-incoming", "shed-oldest", "conflate" or "fail"'
            : 'policy must be one of "shed-incoming", "shed-oldest", "conflate", "fail"',
      }),
      conflate: functionSchema<(pending: unknown, incoming: unknown) => unknown>().optional(),
      onShed: functionSchema<(event: unknown) => void>().optional(),
      stats: z.instanceof(StageStats).optional(),
    })
    .strict()
    .refine((o) => o.policy !== 'conflate' || o.conflate !== undefined, {
      error: 'policy "conflate" needs a conflate(pending, incoming) reducer',
      path: ['conflate'],
    }),
);

/**
 * Adapts a source that cannot be paused (a Subject, `fromEvent`, a socket, any plain
 * Observable) into a Flow with a bounded buffer and an explicit policy for when the
 * consumer falls behind. The types (and a clear error at construction) refuse `pause`.
 *
 * ```
 * source (hot):   -a-b-c-d-e-|
 * consumer pulls: ----1-----1-----1...
 * fromPush(source, { capacity: 2, policy: 'shed-oldest' })
 * ```
 *
 * ## Example
 * ```ts
 * const clicks = fromPush(fromEvent(button, 'click'), { capacity: 100, policy: 'shed-oldest' });
 * clicks.pipe(stage(handle, { name: 'handle' })).subscribe();
 * ```
 */
export function fromPush<T>(source: Observable<T>, options: PushOptions<T>): Flow<T> {
  const config = parseOptions(pushOptionsSchema(), options, 'fromPush options');
  const stats = config.stats ?? new StageStats();
  return new Flow<T>((outlet) => new PushProducer(source, config as ParsedPush<T>, stats, outlet));
}

type ParsedPush<T> = Omit<z.output<ReturnType<typeof pushOptionsSchema>>, 'conflate' | 'onShed'> & Pick<PushOptions<T>, 'conflate' | 'onShed'>;

class PushProducer<T> implements Producer {
  private readonly held: Ring<T>;
  private subscription: Subscription | undefined;
  private sourceDone = false;
  private failure: { error: unknown } | undefined;
  private ended = false;

  constructor(
    private readonly source: Observable<T>,
    private readonly config: ParsedPush<T>,
    private readonly stats: StageStats,
    private readonly outlet: Outlet<T>,
  ) {
    this.held = new Ring(Math.min(config.capacity, 1024));
  }

  start(): void {
    // A push source is subscribed plainly: it takes no demand link.
    this.subscription = withLink(undefined, () =>
      this.source.subscribe({
        next: (value) => this.arrive(value),
        error: (err: unknown) => {
          this.failure = { error: err };
          this.sourceDone = true;
          this.pull();
        },
        complete: () => {
          this.sourceDone = true;
          this.pull();
        },
      }),
    );
    if (this.ended) this.subscription.unsubscribe();
  }

  private arrive(value: T): void {
    if (this.ended || this.sourceDone) return;
    this.stats.receivedCount++;
    if (this.held.length === 0 && this.outlet.wants()) {
      this.deliver(value);
      return;
    }
    if (this.held.length < this.config.capacity) {
      this.held.push(value);
      this.stats.buffered++;
      return;
    }
    switch (this.config.policy) {
      case 'shed-incoming':
        this.shed(value, 'buffer-full');
        return;
      case 'shed-oldest': {
        const oldest = this.held.shift() as T;
        this.held.push(value);
        this.shed(oldest, 'evicted'); // the hook last: it may cancel, which sheds what is held
        return;
      }
      case 'conflate':
        this.held.replaceLast(this.config.conflate!(this.held.peekLast() as T, value));
        this.stats.conflated++;
        this.stats.deliveredCount++;
        return;
      case 'fail':
        // Held elements are delivered first, then the error: the same rule as stage's `fail`.
        this.stats.failed++;
        this.failure = { error: new OverflowError(this.config.name, this.config.capacity) };
        this.sourceDone = true;
        this.subscription?.unsubscribe();
        this.pull();
        return;
    }
  }

  pull(): void {
    while (!this.ended && this.held.length > 0 && this.outlet.wants()) {
      this.stats.buffered--;
      this.deliver(this.held.shift() as T);
    }
    if (!this.ended && this.sourceDone && this.held.length === 0) {
      this.ended = true;
      if (this.failure) this.outlet.error(this.failure.error);
      else this.outlet.complete();
    }
  }

  private deliver(value: T): void {
    this.stats.deliveredCount++;
    this.stats.emittedCount++;
    this.outlet.next(value);
  }

  private shed(value: T, reason: ShedReason): void {
    this.stats.shed[reason]++;
    callHook(this.config.onShed, { stage: this.config.name, reason, value });
  }

  cancel(): void {
    if (this.ended) return;
    this.ended = true;
    this.subscription?.unsubscribe();
    while (this.held.length > 0) {
      this.stats.buffered--;
      this.shed(this.held.shift() as T, 'cancelled');
    }
  }
}
