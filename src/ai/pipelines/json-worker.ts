/**
 * `jsonWorker(worker, format)`: answers that are JSON — any JSON object (`json_object`) or a
 * value of a JSON Schema (`json_schema`) — from a model that cannot be constrained while it
 * decodes. The model is told the format, its whole answer is validated with
 * `parseJsonOutput`, and an invalid one gets one repair attempt: the brackets and commas
 * fixed when that is enough, else the model is shown its answer and the problem and asked
 * again. Still invalid: `OutputInvalidError` (code `OUTPUT_INVALID`), never a half-valid text.
 */
import type * as z from 'zod';
import { defer, finalize, from, map } from 'rxjs';
import { zod } from '../../core/zod.js';
import { AbortedError, InvalidOptionsError, errorMessage } from '../../core/errors.js';
import type { Flow } from '../../flow/demand.js';
import { asFlow } from '../../resilience/as-flow.js';
import { lightRepair, parseJsonOutput, type OutputProblem } from '../stages/json-output.js';
import {
  complete,
  generateRequest,
  type ChatMessage,
  type Completion,
  type GenerateOptions,
  type GenerateRequest,
  type GenerationDone,
  type InferOptions,
  type ModelWorker,
  type Token,
} from '../inference/worker.js';

/** What an answer must be: OpenAI's `response_format` (`json_object`, or `json_schema` with its schema). */
export type JsonFormat =
  | { readonly type: 'json_object' }
  | {
      readonly type: 'json_schema';
      readonly json_schema: { readonly name: string; readonly schema?: Readonly<Record<string, unknown>>; readonly description?: string };
    };

/**
 * The zod schema an answer in `format` must pass. A JSON Schema zod cannot read fails with
 * `InvalidOptionsError` at `response_format.json_schema.schema`.
 */
export function formatSchema(format: JsonFormat): z.ZodType {
  const z = zod();
  const anyObject = z.record(z.string(), z.unknown());
  if (format.type === 'json_object' || format.json_schema.schema === undefined) return anyObject;
  try {
    return z.fromJSONSchema(format.json_schema.schema as Parameters<typeof z.fromJSONSchema>[0]);
  } catch (err) {
    throw new InvalidOptionsError('response_format', [
      { path: 'response_format.json_schema.schema', message: `not a JSON Schema this server can check: ${errorMessage(err)}` },
    ]);
  }
}

/** The instruction the model gets first. */
function instruction(format: JsonFormat): string {
  if (format.type === 'json_object' || format.json_schema.schema === undefined) return 'Answer with one JSON object and nothing else.';
  const about = format.json_schema.description === undefined ? '' : ` (${format.json_schema.description})`;
  return `Answer with one JSON value and nothing else${about}. It must match this JSON Schema:\n${JSON.stringify(format.json_schema.schema)}`;
}

function describe(problem: OutputProblem): string {
  if (problem.kind === 'parse') return `it is not JSON (${problem.message})`;
  return problem.error.issues.map((issue) => `${issue.path.map(String).join('.') || '(root)'}: ${issue.message}`).join('; ');
}

/**
 * Wraps `worker` so each answer is a JSON text of `format`, emitted as one token once it is
 * valid (so a streaming client never sees text that fails later). Usage adds up both
 * generations when the model was asked again.
 *
 * ## Example
 * ```ts
 * const answers = jsonWorker(worker, { type: 'json_schema', json_schema: { name: 'city', schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } });
 * const { text } = await answers.infer(generateRequest({ prompt: 'Where is the Louvre?' })); // '{"city":"Paris"}'
 * ```
 */
export function jsonWorker(worker: ModelWorker<GenerateRequest, Completion>, format: JsonFormat): ModelWorker<GenerateRequest, Completion> {
  const schema = formatSchema(format);
  const told: ChatMessage = { role: 'system', content: instruction(format) };
  const generate = (request: GenerateRequest, options: GenerateOptions = {}): Flow<Token> => {
    const valid = generateRequest(request);
    const messages: readonly ChatMessage[] = [told, ...(valid.messages ?? [{ role: 'user', content: valid.prompt! }])];
    const { prompt: _prompt, messages: _messages, ...params } = valid;
    return asFlow(
      defer(() => {
        // Unsubscribing stops the generation running now: its Promise has no other way to hear it.
        const stop = new AbortController();
        const signal = options.signal === undefined ? stop.signal : AbortSignal.any([stop.signal, options.signal]);
        const dones: GenerationDone[] = [];
        const report = () => {
          const last = dones.at(-1);
          if (last === undefined) return;
          const sum = (pick: (d: GenerationDone) => number) => dones.reduce((n, d) => n + pick(d), 0);
          options.onDone?.({ ...last, usage: { inputTokens: sum((d) => d.usage.inputTokens), outputTokens: sum((d) => d.usage.outputTokens) } });
        };
        const run = (chat: readonly ChatMessage[]): Promise<string> =>
          complete((onDone) => worker.generate(generateRequest({ ...params, messages: chat }), { ...options, signal, onDone })).then(({ text, ...done }) => {
            dones.push({ ...done, timeToFirstToken: undefined, tokensPerSecond: undefined });
            return text;
          });
        const answer = async (): Promise<string> => {
          const text = await run(messages);
          const { value } = await parseJsonOutput(schema, text, {
            name: worker.name,
            signal,
            repair: (bad, problem) => {
              const light = lightRepair(bad);
              if (passes(schema, light)) return light;
              return run([
                ...messages,
                { role: 'assistant', content: bad },
                { role: 'user', content: `That answer is not valid: ${describe(problem)}. Answer again with only the corrected JSON.` },
              ]);
            },
          });
          return JSON.stringify(value);
        };
        return from(answer().finally(report)).pipe(
          map((text): Token => ({ text, index: 0 })),
          finalize(() => stop.abort(new AbortedError(worker.name, 'the consumer unsubscribed'))),
        );
      }),
    );
  };
  return {
    name: worker.name,
    ...(worker.stages !== undefined && { stages: worker.stages }),
    generate,
    infer: (request: GenerateRequest, inferOptions: InferOptions = {}) => complete((onDone) => generate(request, { ...inferOptions, onDone })),
  };
}

function passes(schema: z.ZodType, text: string): boolean {
  try {
    return schema.safeParse(JSON.parse(text)).success;
  } catch {
    return false;
  }
}
