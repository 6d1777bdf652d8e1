import type * as z from 'zod';
import { lazySchema } from '../../core/zod.js';
import { isObservable, lastValueFrom, reduce, type Observable } from 'rxjs';
import { stage, type StageOperator, type StageOptions } from '../../../operators/stage.js';
import { functionSchema, parseOptions } from '../../flow/options.js';
import { SluiceError, errorMessage } from '../../core/errors.js';
import { Traced } from '../../core/trace.js';

/** One response: its whole text, or its token stream (plain or traced chunks). */
export type ResponseText = string | Observable<string | Traced<string>> | AsyncIterable<string | Traced<string>>;

/** Why a text is not the expected JSON: it does not parse, or the schema rejects it. */
export type OutputProblem = { readonly kind: 'parse'; readonly message: string } | { readonly kind: 'schema'; readonly error: z.ZodError };

/** Asks for a better text (e.g. asks the model again, showing it the problem). */
export type Repair = (text: string, problem: OutputProblem, signal: AbortSignal | undefined) => string | PromiseLike<string>;

/** The output is still not valid JSON for the schema after the repair attempt. */
export class OutputInvalidError extends SluiceError {
  /** Each schema issue with its path (`items.0.price`), or one `(root)` issue for a parse failure. */
  readonly issues: readonly { path: string; message: string }[];
  constructor(
    stage: string | undefined,
    problem: OutputProblem,
    /** The last text tried (after the repair). */
    readonly text: string,
  ) {
    const issues =
      problem.kind === 'parse'
        ? [{ path: '', message: problem.message }]
        : problem.error.issues.map((issue) => ({ path: issue.path.map(String).join('.'), message: issue.message }));
    const list = issues.map((i) => `${i.path || '(root)'}: ${i.message}`).join('; ');
    super(
      'OUTPUT_INVALID',
      `${stage ? `Stage "${stage}": output` : 'Output'} is not valid after one repair attempt (${problem.kind === 'parse' ? 'not JSON' : 'schema'}: ${list}).`,
      {
        ...(stage === undefined ? {} : { stage }),
        hint: 'Tighten the prompt (show the schema), or pass a repair(text, problem) that asks the model to fix its answer.',
      },
    );
    this.issues = issues;
  }
}

/** Options of `parseJsonOutput`. */
export interface ParseJsonOutputOptions {
  /** Names the stage in errors. */
  name?: string;
  /** The one repair attempt. Default `'light'`: `lightRepair` (fences, trailing commas, the first {...} block, unclosed brackets). */
  repair?: 'light' | Repair;
  /** Passed to `repair`. */
  signal?: AbortSignal;
}

/** What `parseJsonOutput` found out, beside the value. */
export interface JsonOutcome<V> {
  readonly value: V;
  /** True when the first text was invalid and the repaired one passed. */
  readonly repaired: boolean;
}

const FENCE = /```(?:json|JSON)?[ \t]*\r?\n?([\s\S]*?)(?:```|$)/;

/** The text inside a Markdown code fence, when there is one; the text otherwise. */
export function stripFence(text: string): string {
  const fenced = FENCE.exec(text);
  return fenced === null ? text.trim() : fenced[1]!.trim();
}

function attempt<S extends z.ZodType>(schema: S, text: string): { ok: true; value: z.output<S> } | { ok: false; problem: OutputProblem } {
  let json: unknown;
  try {
    json = JSON.parse(stripFence(text));
  } catch (err) {
    return { ok: false, problem: { kind: 'parse', message: errorMessage(err) } };
  }
  const result = schema.safeParse(json);
  return result.success ? { ok: true, value: result.data } : { ok: false, problem: { kind: 'schema', error: result.error } };
}

/**
 * Makes the usual near-misses of a model parse: takes the fenced block if any, then the
 * first `{...}` or `[...]` block (dropping prose around it), drops trailing commas,
 * and closes an unterminated string and unclosed brackets (a truncated answer).
 *
 * ## Example
 * ```ts
 * lightRepair('Sure! ```json\n{"a": [1, 2,], "b": "x'); // '{"a": [1, 2], "b": "x"}'
 * ```
 */
export function lightRepair(text: string): string {
  const body = stripFence(text);
  const begin = body.search(/[{[]/);
  if (begin < 0) return body;
  const closers: string[] = [];
  let out = '';
  let inString = false;
  let escaped = false;
  for (let i = begin; i < body.length; i++) {
    const c = body[i]!;
    if (inString) {
      out += c;
      if (escaped) escaped = false;
      else if (c === '\\') escaped = true;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') inString = true;
    else if (c === '{') closers.push('}');
    else if (c === '[') closers.push(']');
    else if (c === '}' || c === ']') {
      out = out.replace(/,\s*$/, '');
      closers.pop();
      out += c;
      if (closers.length === 0) return out;
      continue;
    }
    out += c;
  }
  // Truncated: close what is open, after dropping a dangling comma, key or colon.
  if (inString) out += escaped ? '\\"' : '"';
  out = out
    .replace(/,\s*$/, '')
    .replace(/,?\s*"(?:[^"\\]|\\.)*"\s*:\s*$/, '')
    .replace(/:\s*$/, '');
  out = out.replace(/,\s*$/, '');
  while (closers.length > 0) out += closers.pop();
  return out;
}

/** Joins a response's text, whichever form it came in. */
export async function collectText(response: ResponseText): Promise<string> {
  if (typeof response === 'string') return response;
  const chunk = (c: string | Traced<string>): string => (c instanceof Traced ? c.value : c);
  if (isObservable(response))
    return lastValueFrom(response.pipe(reduce((text: string, c: string | Traced<string>) => text + chunk(c), '')), { defaultValue: '' });
  let text = '';
  for await (const c of response) text += chunk(c);
  return text;
}

/**
 * Parses a model's JSON answer and validates it against `schema`, with one repair
 * attempt; rejects with `OutputInvalidError` (code `OUTPUT_INVALID`) naming the path
 * of every schema issue when the repaired text fails too.
 *
 * ## Example
 * ```ts
 * const { value } = await parseJsonOutput(z.object({ city: z.string() }), '```json\n{"city": "Oslo",}\n```');
 * value.city; // 'Oslo' (typed)
 * ```
 */
export async function parseJsonOutput<S extends z.ZodType>(
  schema: S,
  response: ResponseText,
  options: ParseJsonOutputOptions = {},
): Promise<JsonOutcome<z.output<S>>> {
  const text = await collectText(response);
  const first = attempt(schema, text);
  if (first.ok) return { value: first.value, repaired: false };
  const repair = options.repair ?? 'light';
  const repairedText = repair === 'light' ? lightRepair(text) : await repair(text, first.problem, options.signal);
  if (typeof repairedText !== 'string')
    throw new OutputInvalidError(options.name, { kind: 'parse', message: `repair returned ${typeof repairedText}, not text` }, String(repairedText));
  const second = attempt(schema, repairedText);
  if (second.ok) return { value: second.value, repaired: true };
  throw new OutputInvalidError(options.name, second.problem, repairedText);
}

/** Options of `jsonOutput`: the schema the answer must meet and the repair attempt. */
export interface JsonOutputOptions extends Omit<StageOptions<ResponseText>, 'conflate'> {
  /** The one repair attempt: `'light'` (default, `lightRepair`) or your own, e.g. asking the model again. */
  repair?: 'light' | Repair;
}

const jsonOutputOptionsSchema = lazySchema((z) =>
  z
    .object({
      repair: z
        .union([z.literal('light'), functionSchema<Repair>()], {
          error: 'repair must be "light" or a function (text, problem, signal) => string | Promise<string>',
        })
        .default('light'),
    })
    // The rest is `stage`'s, validated there.
    .loose(),
);

/**
 * A stage that turns each response — a whole text or its token stream — into a value
 * of `schema`'s type: collects the text, parses it (a ```json fence is fine),
 * validates, and on failure makes one repair attempt. A response still invalid fails
 * with `OutputInvalidError` (code `OUTPUT_INVALID`, the zod issue paths in `issues`),
 * handled by `errorPolicy` like any stage failure. The trace notes
 * `"<name>.repaired"` (true/false).
 *
 * ```
 * source:  -a---b---c-|      a = '{"n":1}', b = '{"n":2,}', c = 'no json'
 * jsonOutput(z.object({ n: z.number() }), { errorPolicy: 'skip' })
 * output:  -x---y-----|      x = {n:1}, y = {n:2} (repaired); c fails: onFailure gets OUTPUT_INVALID
 * ```
 *
 * ## Example
 * ```ts
 * const Answer = z.object({ answer: z.string(), sources: z.array(z.string()) });
 * prompts.pipe(
 *   map((prompt) => model.stream(prompt)),                       // one token stream per prompt
 *   jsonOutput(Answer, {
 *     name: 'answer',
 *     repair: (text, problem, signal) => model.complete(`Fix this JSON (${problem.kind}):\n${text}`, { signal }),
 *   }),
 * ); // Flow<Traced<{ answer: string; sources: string[] }>>
 * ```
 *
 * Invalid options throw `InvalidOptionsError` naming each bad field.
 *
 * @see parseJsonOutput; lightRepair.
 */
export function jsonOutput<S extends z.ZodType>(schema: S, options: JsonOutputOptions = {}): StageOperator<ResponseText, z.output<S>> {
  const name = options?.name ?? 'json-output';
  const { repair, ...stageOptions } = parseOptions(jsonOutputOptionsSchema(), options, `jsonOutput "${name}" options`);
  return stage<ResponseText, z.output<S>>(
    async (response, context) => {
      const { value, repaired } = await parseJsonOutput(schema, response, { name, repair, signal: context.signal });
      context.note('repaired', repaired);
      return value;
    },
    { ...(stageOptions as StageOptions<ResponseText>), name },
  );
}
