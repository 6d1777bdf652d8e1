/** `POST /v1/chat/completions` and `POST /v1/completions`: the body checked against the model it names, then generated. */
import type * as z from 'zod';
import type { ModelWorker } from '../../ai/inference/worker.js';
import { jsonWorker, type JsonFormat } from '../../ai/pipelines/json-worker.js';
import { ApiError, bodyError, type ChatWorker, chatSchema, passthroughChatSchema, toApiError, toGenerateRequest } from '../openai-wire.js';
import { chatFraming } from '../framing.js';
import { parseJson } from '../http-io.js';
import { completionsSchema, passthroughCompletionsSchema, promptOf, textFraming, toCompletionRequest } from '../completions-wire.js';
import type { RequestContext } from './context.js';
import type { HttpEdge } from './edge.js';
import { generate } from './generate.js';

export async function chat(edge: HttpEdge, ctx: RequestContext): Promise<void> {
  // An upstream's model takes the fields sluice does not know (tools, response_format...) and forwards them.
  const checked = await modelBody(edge, ctx, chatSchema(), passthroughChatSchema());
  if (checked === undefined) return;
  const { body, forwarded, served } = checked;
  // An upstream checks its own formats; a model here is told the format and its answer validated.
  const format =
    forwarded !== undefined || !('response_format' in body) ? undefined : (body.response_format as JsonFormat | { type: 'text' } | null | undefined);
  const worker = format == null || format.type === 'text' ? served : jsonAnswers(served, format);
  const request = toGenerateRequest(body, edge.config.maxTokens, forwarded);
  await edge.admitted(ctx, () => generate(edge, ctx, { body, worker, request, framing: chatFraming }));
}

/** A prompt continued as it is (no chat template), framed as `text_completion`. */
export async function completions(edge: HttpEdge, ctx: RequestContext): Promise<void> {
  const checked = await modelBody(edge, ctx, completionsSchema(), passthroughCompletionsSchema());
  if (checked === undefined) return;
  const { body, forwarded, served } = checked;
  const request = toCompletionRequest(body, edge.config.maxTokens, forwarded);
  // An upstream echoes its own prompt; here the echo is the prompt's text.
  const framing = textFraming(body.echo === true && forwarded === undefined ? promptOf(body) : undefined);
  await edge.admitted(ctx, () => generate(edge, ctx, { body, worker: served, request, framing }));
}

/**
 * A POST body checked by the schema of the model it names — an upstream's (`forwarded`: the body as
 * sent, for the upstream) or one served here — and that model's worker; 404 for no such model.
 * Undefined when the door refused it, before its body was parsed: its answer is sent.
 */
async function modelBody<L extends z.ZodType<{ readonly model: string }>, U extends z.ZodType<{ readonly model: string }>>(
  edge: HttpEdge,
  ctx: RequestContext,
  local: L,
  upstream: U,
): Promise<{ body: z.output<L> | z.output<U>; forwarded: Record<string, unknown> | undefined; served: ChatWorker } | undefined> {
  const bytes = await edge.readBytes(ctx.req);
  // Load before content: checking a body costs what the refusal is there to save; it is checked once admitted.
  if (edge.door?.refused(ctx, bytes) === true) return undefined;
  const raw = parseJson(bytes);
  const named = modelNamed(raw);
  const passthrough = named !== undefined && edge.workers.get(named)?.passthrough === true;
  const parsed = (passthrough ? upstream : local).safeParse(raw);
  if (!parsed.success) throw bodyError(parsed.error.issues[0]!);
  const body = parsed.data as z.output<L> | z.output<U>;
  const served = edge.workers.get(body.model);
  if (served === undefined) throw new ApiError(404, `The model \`${body.model}\` does not exist.`, 'invalid_request_error', 'model_not_found', 'model');
  return { body, forwarded: passthrough ? (raw as Record<string, unknown>) : undefined, served };
}

/** The `model` a raw body names, before it is checked. */
export function modelNamed(raw: unknown): string | undefined {
  return typeof raw === 'object' && raw !== null && typeof (raw as { model?: unknown }).model === 'string' ? (raw as { model: string }).model : undefined;
}

/** `served` answering in `format` (an invalid JSON Schema is the client's 400). */
function jsonAnswers(served: ChatWorker, format: JsonFormat): ChatWorker {
  try {
    return jsonWorker(served as ModelWorker, format);
  } catch (err) {
    throw toApiError(err);
  }
}
