/**
 * Whether every value one JSON Schema admits is admitted by another: what a link's receivers
 * accept must cover what its producers send. Conservative: it proves the keywords zod emits
 * (types, properties, required, additional properties, items, enums and constants, unions,
 * bounds, lengths, patterns and formats compared for equality) and reports anything it cannot
 * prove as a reason, each with the path where it found it.
 *
 * Written here because the library found for it (json-schema-diff 1.0.0) reports a narrowed
 * enum as compatible (see docs/nats.md, *Contracts*).
 */
export type JsonSchema = boolean | { readonly [keyword: string]: unknown };
type SchemaObject = { readonly [keyword: string]: unknown };

/** Reasons `producer` may send a value `receiver` refuses; empty when every value it admits is admitted. */
export function unadmitted(receiver: JsonSchema, producer: JsonSchema, path = ''): string[] {
  if (producer === false || receiver === true) return [];
  if (receiver === false) return [`${at(path)}: the receiver admits nothing`];
  const p: SchemaObject = producer === true ? {} : producer;
  const r = receiver;
  const producerBranches = (p.anyOf ?? p.oneOf) as JsonSchema[] | undefined;
  if (producerBranches !== undefined) return producerBranches.flatMap((branch) => unadmitted(r, merge(p, branch), path));
  const receiverBranches = (r.anyOf ?? r.oneOf) as JsonSchema[] | undefined;
  if (receiverBranches !== undefined) {
    const rest = omit(r, ['anyOf', 'oneOf']);
    if (receiverBranches.some((branch) => unadmitted(merge(rest, branch), p, path).length === 0)) return [];
    return [`${at(path)}: no branch of the receiver's union admits what the producer sends`];
  }
  if (Array.isArray(r.allOf)) return (r.allOf as JsonSchema[]).flatMap((part) => unadmitted(part, p, path)).concat(unadmitted(omit(r, ['allOf']), p, path));
  const values = valuesOf(p);
  if (values !== undefined) return values.flatMap((value) => (refuses(r, value) ? [`${at(path)}: the receiver refuses ${JSON.stringify(value)}`] : []));
  if (r.enum !== undefined || r.const !== undefined) return [`${at(path)}: the receiver admits only ${JSON.stringify(r.enum ?? [r.const])}`];
  const reasons = typeReasons(r, p, path);
  if (reasons.length > 0) return reasons;
  return [...boundReasons(r, p, path), ...arrayReasons(r, p, path), ...objectReasons(r, p, path)];
}

const KNOWN_TYPES = ['string', 'number', 'integer', 'boolean', 'null', 'object', 'array'];

function typesOf(schema: SchemaObject): string[] | undefined {
  const type = schema.type;
  if (type === undefined) return undefined;
  return Array.isArray(type) ? (type as string[]) : [type as string];
}

function typeReasons(r: SchemaObject, p: SchemaObject, path: string): string[] {
  const accepted = typesOf(r);
  if (accepted === undefined) return [];
  const sent = typesOf(p) ?? KNOWN_TYPES;
  const refused = sent.filter((type) => !accepted.includes(type) && !(type === 'integer' && accepted.includes('number')));
  return refused.length === 0 ? [] : [`${at(path)}: the producer may send ${refused.join(' or ')}, the receiver admits ${accepted.join(' or ')}`];
}

/** Lower bounds the receiver sets must be met by the producer's, upper bounds likewise; patterns and formats must be the same. */
function boundReasons(r: SchemaObject, p: SchemaObject, path: string): string[] {
  const reasons: string[] = [];
  for (const key of ['minimum', 'exclusiveMinimum', 'minLength', 'minItems', 'minProperties']) {
    const limit = r[key];
    if (typeof limit !== 'number') continue;
    const own = lowerOf(p, key);
    if (own === undefined || own < limit)
      reasons.push(`${at(path)}: the receiver needs ${key} ${limit}, the producer ${own === undefined ? 'sets none' : `allows ${own}`}`);
  }
  for (const key of ['maximum', 'exclusiveMaximum', 'maxLength', 'maxItems', 'maxProperties']) {
    const limit = r[key];
    if (typeof limit !== 'number') continue;
    const own = upperOf(p, key);
    if (own === undefined || own > limit)
      reasons.push(`${at(path)}: the receiver needs ${key} ${limit}, the producer ${own === undefined ? 'sets none' : `allows ${own}`}`);
  }
  for (const key of ['pattern', 'format', 'multipleOf']) {
    if (r[key] !== undefined && r[key] !== p[key])
      reasons.push(
        `${at(path)}: the receiver needs ${key} ${JSON.stringify(r[key])}, the producer ${p[key] === undefined ? 'sets none' : JSON.stringify(p[key])}`,
      );
  }
  return reasons;
}

/** The producer's tightest lower bound for `key` (an exclusive bound counts as the same limit, which is tighter). */
function lowerOf(p: SchemaObject, key: string): number | undefined {
  const own = p[key] ?? (key === 'minimum' ? p.exclusiveMinimum : undefined);
  return typeof own === 'number' ? own : undefined;
}

function upperOf(p: SchemaObject, key: string): number | undefined {
  const own = p[key] ?? (key === 'maximum' ? p.exclusiveMaximum : undefined);
  return typeof own === 'number' ? own : undefined;
}

function arrayReasons(r: SchemaObject, p: SchemaObject, path: string): string[] {
  if (r.items === undefined) return [];
  if (Array.isArray(r.items) || Array.isArray(p.items)) return r.items === p.items ? [] : [`${at(path)}: tuples are compared only when equal`];
  return unadmitted(r.items as JsonSchema, (p.items as JsonSchema | undefined) ?? true, `${path}[]`);
}

function objectReasons(r: SchemaObject, p: SchemaObject, path: string): string[] {
  const reasons: string[] = [];
  const sentRequired = new Set((p.required as string[] | undefined) ?? []);
  for (const key of (r.required as string[] | undefined) ?? [])
    if (!sentRequired.has(key)) reasons.push(`${at(join(path, key))}: the receiver requires it, the producer may leave it out`);
  const accepted = (r.properties ?? {}) as Record<string, JsonSchema>;
  const sent = (p.properties ?? {}) as Record<string, JsonSchema>;
  const others = r.additionalProperties as JsonSchema | undefined;
  for (const [key, schema] of Object.entries(sent)) {
    const target = accepted[key] ?? others ?? true;
    reasons.push(...unadmitted(target, schema, join(path, key)));
  }
  if (r.properties !== undefined || others !== undefined) {
    const sentOthers = (p.additionalProperties as JsonSchema | undefined) ?? true;
    if (sentOthers !== false && others !== undefined && others !== true) reasons.push(...unadmitted(others, sentOthers, join(path, '*')));
  }
  return reasons;
}

/** The values a schema admits when it lists them (`enum`, `const`). */
function valuesOf(p: SchemaObject): unknown[] | undefined {
  if (p.const !== undefined) return [p.const];
  return Array.isArray(p.enum) ? p.enum : undefined;
}

/** Whether `receiver` refuses one listed value (for enums and constants: checked value by value). */
function refuses(receiver: JsonSchema, value: unknown): boolean {
  if (receiver === true) return false;
  if (receiver === false) return true;
  const r = receiver;
  const branches = (r.anyOf ?? r.oneOf) as JsonSchema[] | undefined;
  if (branches?.every((branch) => refuses(merge(omit(r, ['anyOf', 'oneOf']), branch), value))) return true;
  if (r.const !== undefined && r.const !== value) return true;
  if (Array.isArray(r.enum) && !r.enum.includes(value)) return true;
  const types = typesOf(r);
  if (types !== undefined && !types.includes(typeOfValue(value)) && !(typeOfValue(value) === 'integer' && types.includes('number'))) return true;
  if (typeof value === 'number') {
    if (typeof r.minimum === 'number' && value < r.minimum) return true;
    if (typeof r.maximum === 'number' && value > r.maximum) return true;
  }
  if (typeof value === 'string') {
    if (typeof r.minLength === 'number' && value.length < r.minLength) return true;
    if (typeof r.maxLength === 'number' && value.length > r.maxLength) return true;
    if (typeof r.pattern === 'string' && !new RegExp(r.pattern, 'u').test(value)) return true;
  }
  return false;
}

function typeOfValue(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  return typeof value;
}

function merge(base: SchemaObject, branch: JsonSchema): JsonSchema {
  if (typeof branch === 'boolean') return branch;
  return { ...omit(base, ['anyOf', 'oneOf']), ...branch };
}

function omit(schema: SchemaObject, keys: readonly string[]): SchemaObject {
  return Object.fromEntries(Object.entries(schema).filter(([key]) => !keys.includes(key)));
}

function join(path: string, key: string): string {
  return path === '' ? key : `${path}.${key}`;
}

function at(path: string): string {
  return path === '' ? '(root)' : path;
}
