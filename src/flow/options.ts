import type * as z from 'zod';
import { zod } from '../core/zod.js';
import type { SchedulerLike } from 'rxjs';
import { InvalidOptionsError } from '../core/errors.js';

export { POLICIES } from '../core/vocabulary.js';
export type { Policy, ShedReason, Outcome } from '../core/vocabulary.js';

// Helpers for schemas built lazily (see core/zod.ts): each is called from inside a builder, so zod is loaded by then.
/** @internal */
export const positiveInt = (what: string) =>
  zod()
    .number({ error: `${what} must be a number` })
    .int({ error: `${what} must be an integer` })
    .positive({ error: `${what} must be ≥ 1` });

/** @internal */
export const schedulerSchema = () =>
  zod().custom<SchedulerLike>(
    (v) => typeof v === 'object' && v !== null && typeof (v as SchedulerLike).schedule === 'function' && typeof (v as SchedulerLike).now === 'function',
    { error: 'must be an RxJS SchedulerLike (with schedule() and now())' },
  );

/** @internal */
export const functionSchema = <F>() => zod().custom<F>((v) => typeof v === 'function', { error: 'must be a function' });

/** Validates `input` against `schema`; throws `InvalidOptionsError` naming every bad field's path. @internal */
export function parseOptions<S extends z.ZodType>(schema: S, input: unknown, what: string): z.output<S> {
  const result = schema.safeParse(input ?? {});
  if (result.success) return result.data;
  throw new InvalidOptionsError(
    what,
    result.error.issues.flatMap((issue) => {
      const path = issue.path.map(String);
      // An unknown key is reported at its own path, so a misspelt field reads like any bad field.
      if (issue.code === 'unrecognized_keys') {
        return issue.keys.map((key) => ({ path: [...path, key].join('.'), message: `unknown option "${key}"` }));
      }
      return [{ path: path.join('.'), message: issue.message }];
    }),
  );
}
