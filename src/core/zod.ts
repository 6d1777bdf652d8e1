/**
 * zod, loaded the first time an option is validated rather than when sluice is imported: zod's
 * module loading would otherwise dominate the cost of `import 'sluice'` (figures:
 * docs/internals/import-cost.md). A synchronous `require`, because constructors validate
 * synchronously; every layer of sluice goes through here, so one zod instance serves them all.
 */
import { createRequire } from 'node:module';
import type * as Zod from 'zod';
import { MissingPeerError } from './errors.js';

export type ZodModule = typeof Zod;

let loaded: ZodModule | undefined;

/** The zod module, loaded on the first call. */
export function zod(): ZodModule {
  if (loaded === undefined) {
    try {
      loaded = createRequire(import.meta.url)('zod') as ZodModule;
    } catch (error) {
      // e.g. sluice bundled into one file that is run without node_modules: bundlers do not follow this require.
      if ((error as { code?: unknown }).code === 'MODULE_NOT_FOUND') throw new MissingPeerError('zod', 'sluice', error);
      throw error;
    }
  }
  return loaded;
}

/** A schema built on first use: `build` runs once, when the returned function is first called. */
export function lazySchema<S>(build: (z: ZodModule) => S): () => S {
  let schema: S | undefined;
  return () => {
    if (schema === undefined) schema = build(zod());
    return schema;
  };
}

/**
 * One of `literals`, or what `schema` accepts. A value that is neither is reported as `schema`
 * reports it, so the bad field inside is named (`abstain.names`) where a union would name only
 * itself ("Invalid input" at `abstain`).
 */
export function literalOr<const L extends boolean | string | number, S extends import('zod').ZodType>(literals: readonly L[], schema: S) {
  const z = zod();
  return z
    .custom<L | import('zod').input<S>>(() => true)
    .transform((value, ctx): L | import('zod').output<S> => {
      if ((literals as readonly unknown[]).includes(value)) return value as L;
      const parsed = schema.safeParse(value);
      if (parsed.success) return parsed.data;
      for (const issue of parsed.error.issues) ctx.addIssue(issue as Parameters<typeof ctx.addIssue>[0]);
      return z.NEVER;
    });
}

/** Whether `value` is a zod 4 schema, from any copy of zod (a user's ESM import is not our instance, so no `instanceof`). */
export function isZodSchema(value: unknown): value is import('zod').ZodType {
  return typeof value === 'object' && value !== null && '_zod' in value && typeof (value as { safeParse?: unknown }).safeParse === 'function';
}

/** Whether `value` is a zod object schema (from any copy of zod), whose `shape` names its fields. */
export function isObjectSchema(value: unknown): value is import('zod').ZodObject {
  return isZodSchema(value) && value._zod.def.type === 'object' && 'shape' in value;
}

/**
 * `true` only when interface `I` and schema input `S` have the same fields and each is assignable to
 * the other: an option type written by hand stays provably in step with the schema that checks it.
 * @internal
 */
export type SchemaMatches<I, S> = [Exclude<keyof I, keyof S> | Exclude<keyof S, keyof I>] extends [never]
  ? [I] extends [S]
    ? [S] extends [I]
      ? true
      : false
    : false
  : false;

/** Compiles only for `true`: `type Check = Holds<SchemaMatches<Options, z.input<Schema>>>`. @internal */
export type Holds<T extends true> = T;
