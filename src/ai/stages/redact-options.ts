import type { SchedulerLike } from 'rxjs';
import type * as z from 'zod';
import { lazySchema, zod, type Holds, type SchemaMatches } from '../../core/zod.js';
import { functionSchema, positiveInt, schedulerSchema } from '../../flow/options.js';
import { StageStats } from '../../flow/stats.js';
import { PII_KINDS, type PiiKind, type RedactPattern } from './pii-detectors.js';

/**
 * Counters of a `redact` operator: `received` counts tokens in, `emitted` chunks out,
 * `delivered` tokens taken in (their text goes out now, with a later chunk, or at
 * completion). Held text that an error or an unsubscribe drops is counted in
 * `dropped` (characters): it was never let out, so nothing unredacted leaked.
 */
export class RedactStats extends StageStats {
  /** Matches replaced, per kind (`email`, `card`, a pattern's `name`...). */
  readonly redacted: Record<string, number> = {};
  /** Times `maxHold` forced out text that could still have been the start of a match. */
  forced = 0;
  /** Held characters dropped by an upstream error or an unsubscribe. */
  dropped = 0;
}

/** Options of `redact`: the kinds of PII to detect, extra patterns, the replacements and how long a possible match is held. */
export interface RedactOptions {
  /** Names the operator in errors, trace notes and stats. Default `redact`. */
  name?: string;
  /** Built-in detectors to run. Default all: `['card', 'ip', 'email', 'phone']`. */
  detect?: readonly PiiKind[];
  /** Replacement text per built-in kind, e.g. `{ email: '<email>' }`. */
  replacements?: Partial<Record<PiiKind, string>>;
  /** Extra patterns, tried after the built-ins. */
  patterns?: readonly RedactPattern[];
  /**
   * Characters that may be held back at most (default 1024). The built-in detectors
   * never need more than about 600; past the bound the oldest held text is redacted
   * as if the stream ended there and let out (`stats.forced`), so a pathological stream
   * cannot grow memory.
   */
  maxHold?: number;
  /**
   * `trace` (default): an element whose trace differs from the held text's starts a new
   * response, so the held text is flushed first and no match spans two responses.
   * `none`: the whole subscription is one text.
   */
  boundary?: 'trace' | 'none';
  /** Redacted chunks waiting for downstream demand before no more demand goes upstream. Default 1. */
  capacity?: number;
  /** Timers of the demand link. Default `asyncScheduler`. */
  scheduler?: SchedulerLike;
  /** Counters shared by every subscription. */
  stats?: RedactStats;
}

const patternSchema = lazySchema((z) =>
  z
    .object({
      name: z.string().min(1, { error: 'name must not be empty' }),
      pattern: z.instanceof(RegExp, { error: 'pattern must be a RegExp' }),
      replacement: z.string().optional(),
      maxLength: positiveInt('maxLength').optional(),
      partial: z.instanceof(RegExp, { error: 'partial must be a RegExp' }).optional(),
      validate: functionSchema<(match: string) => boolean>().optional(),
    })
    .strict()
    .refine((p) => p.partial === undefined || p.partial.source.endsWith('$'), {
      error: 'partial must end with $ (it matches the tail of the text)',
      path: ['partial'],
    }),
);

const redactorFields = () => {
  const z = zod();
  return {
    detect: z
      .array(z.enum(PII_KINDS, { error: `detect entries must be one of ${PII_KINDS.map((k) => `"${k}"`).join(', ')}` }))
      .readonly()
      .optional(),
    replacements: z.partialRecord(z.enum(PII_KINDS), z.string()).optional(),
    patterns: z.array(patternSchema()).readonly().optional(),
    maxHold: positiveInt('maxHold').default(1024),
  };
};

/** @internal The options of a `Redactor`: the detection fields of `RedactOptions`. */
export const redactorOptionsSchema = lazySchema((z) => z.object(redactorFields()).strict());

/** @internal The one check of `redact`'s options; `RedactOptions` is its input, written out. */
export const redactOptionsSchema = lazySchema((z) =>
  z
    .object({
      ...redactorFields(),
      name: z.string().min(1, { error: 'name must not be empty' }).optional(),
      boundary: z.enum(['trace', 'none'], { error: 'boundary must be "trace" or "none"' }).default('trace'),
      capacity: positiveInt('capacity').default(1),
      scheduler: schedulerSchema().optional(),
      stats: z.instanceof(RedactStats, { error: 'stats must be a RedactStats' }).optional(),
    })
    .strict(),
);

/** @internal Fails to compile when `RedactOptions` and the schema's input part ways. */
export type RedactOptionsInStep = Holds<SchemaMatches<RedactOptions, z.input<ReturnType<typeof redactOptionsSchema>>>>;
