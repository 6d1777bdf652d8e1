/** `POST /v1/embeddings`: vectors of a model served here, or the body forwarded to the upstream that serves it. */
import { performance } from 'node:perf_hooks';
import { AbortedError } from '../../core/errors.js';
import { ApiError, base64Vector, bodyError, type EmbeddingModel, embeddingsSchema } from '../openai-wire.js';
import { sendJson } from '../http-io.js';
import type { RequestContext } from './context.js';
import type { HttpEdge } from './edge.js';
import { modelNamed } from './completions.js';

export async function embeddings(edge: HttpEdge, ctx: RequestContext): Promise<void> {
  const raw = await edge.readBody(ctx.req);
  const named = modelNamed(raw);
  // An upstream's model gets the body as it is: its token ids, dimensions and vendor fields are its business.
  if (named !== undefined && !edge.embedders.has(named) && (await forwarded(edge, ctx, named, raw as Record<string, unknown>))) return;
  const parsed = embeddingsSchema().safeParse(raw);
  if (!parsed.success) throw bodyError(parsed.error.issues[0]!);
  const body = parsed.data;
  const model = edge.embedders.get(body.model);
  if (model === undefined)
    throw new ApiError(404, `The model \`${body.model}\` does not exist or does not embed.`, 'invalid_request_error', 'model_not_found', 'model');
  const texts = typeof body.input === 'string' ? [body.input] : body.input;
  const release = edge.admitTenant(ctx.tenant);
  const startedAt = performance.now();
  let result: Awaited<ReturnType<EmbeddingModel['embed']>>;
  try {
    result = await model.embed(texts);
  } finally {
    release();
  }
  const { vectors, tokens } = result;
  const size = vectors[0]?.length ?? 0;
  if (body.dimensions != null && body.dimensions !== size)
    throw new ApiError(400, `dimensions must be ${size} for ${body.model} (it cannot be shortened)`, 'invalid_request_error', 'invalid_value', 'dimensions');
  const base64 = body.encoding_format === 'base64';
  sendJson(ctx.res, 200, {
    object: 'list',
    data: vectors.map((vector, index) => ({ object: 'embedding', index, embedding: base64 ? base64Vector(vector) : Array.from(vector) })),
    model: body.model,
    usage: { prompt_tokens: tokens, total_tokens: tokens },
  });
  ctx.log({ model: body.model, outcome: 'completed', status: 200, inputTokens: tokens }, startedAt);
}

/** Answers with an upstream's embeddings of `model`; false when no upstream serves it. */
async function forwarded(edge: HttpEdge, ctx: RequestContext, model: string, raw: Record<string, unknown>): Promise<boolean> {
  const upstream = edge.config.upstreamEmbeddings;
  if (upstream === undefined) return false;
  const controller = new AbortController();
  const leave = () => {
    if (!ctx.res.writableFinished) controller.abort(new AbortedError('embeddings', 'the client disconnected'));
  };
  ctx.res.on('close', leave);
  const release = edge.admitTenant(ctx.tenant);
  const startedAt = performance.now();
  try {
    const forwarding = upstream(model, raw, controller.signal);
    if (forwarding === undefined) return false;
    const answer = await forwarding;
    sendJson(ctx.res, 200, answer);
    const usage = (answer as { usage?: { prompt_tokens?: unknown } } | null)?.usage?.prompt_tokens;
    ctx.log({ model, outcome: 'completed', status: 200, ...(typeof usage === 'number' && { inputTokens: usage }) }, startedAt);
    return true;
  } finally {
    ctx.res.off('close', leave);
    release();
  }
}
