/**
 * The options `partition`, `balance` and `broadcast` share, checked once: the schema every
 * fan-out extends with its own fields, the parse that names the operator in errors, and the
 * settings every lane run needs from the parsed result.
 */
import type * as z from 'zod';
import type { SchedulerLike } from 'rxjs';
import { lazySchema, type ZodModule } from '../src/core/zod.js';
import { functionSchema, parseOptions, positiveInt, schedulerSchema } from '../src/flow/options.js';
import { StageStats } from '../src/flow/stats.js';
import type { LaneConfig, LaneFactory, LaneShedEvent } from './lanes.js';

/** Options every fan-out operator takes. */
export interface LaneOptions<T> {
  /** Names the operator in errors, shed events and metrics. */
  name?: string;
  /** Elements each lane may buffer for its consumer. */
  capacity?: number;
  /** Called with every element a lane sheds, and why. */
  onShed?: (event: LaneShedEvent<T>) => void;
  /** Counters shared by every subscription (broadcast counts one copy per branch). */
  stats?: StageStats;
  /** Timers of the upstream link's in-transit wait. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
  /** How long the upstream link waits for an element a deferring plain operator may have dropped (ms). Default 1000. */
  transitTimeout?: number;
}

/** `LaneOptions` as parsed: what `laneConfig` reads. */
interface ParsedLaneOptions {
  readonly name?: string | undefined;
  readonly onShed?: ((event: LaneShedEvent<unknown>) => void) | undefined;
  readonly scheduler?: SchedulerLike | undefined;
  readonly transitTimeout: number;
}

/**
 * @internal
 * A fan-out operator's strict options schema, built on first use: the `LaneOptions` fields
 * plus the operator's own (`own` may override `capacity` with its default).
 */
export function fanOutSchema<S extends z.ZodRawShape>(own: (z: ZodModule) => S) {
  return lazySchema((z) =>
    z
      .object({
        name: z.string().min(1, { error: 'name must not be empty' }).optional(),
        onShed: functionSchema<(event: LaneShedEvent<unknown>) => void>().optional(),
        stats: z.instanceof(StageStats, { error: 'stats must be a StageStats' }).optional(),
        scheduler: schedulerSchema().optional(),
        transitTimeout: z.number({ error: 'transitTimeout must be a number of ms' }).positive({ error: 'transitTimeout must be > 0 ms' }).default(1000),
        ...own(z),
      })
      .strict(),
  );
}

/** @internal `capacity`: lane elements, an integer ≥ 1. */
export const capacitySchema = () => positiveInt('capacity');

/** @internal Parses `options`; an `InvalidOptionsError` names the operator (`partition "sessions" options`) and each bad field. */
export function parseFanOutOptions<S extends z.ZodType>(kind: string, schema: S, options: { readonly name?: string } | undefined): z.output<S> {
  return parseOptions(schema, options, `${kind}${options?.name ? ` "${options.name}"` : ''} options`);
}

let unnamed = 0;

/** @internal The settings every lane run needs: the name (default `partition-1`, `balance-2`...), capacity, lanes and hooks. */
export function laneConfig<T, R>(kind: string, parsed: ParsedLaneOptions, capacity: number, factories: readonly LaneFactory<T, R>[]): LaneConfig<T, R> {
  return {
    name: parsed.name ?? `${kind}-${++unnamed}`,
    capacity,
    factories,
    onShed: parsed.onShed,
    scheduler: parsed.scheduler,
    transitTimeout: parsed.transitTimeout,
  };
}
