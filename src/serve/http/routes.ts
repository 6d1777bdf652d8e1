/** The route table of the HTTP edge: one declaration per route (method, path, whether it is the API, handler). */
import { ApiError } from '../openai-wire.js';
import { headerValue, sendJson } from '../http-io.js';
import type { RequestContext } from './context.js';
import type { HttpEdge } from './edge.js';
import type { Route } from './route.js';
import { chat, completions } from './completions.js';
import { embeddings } from './embeddings.js';

export function routeTable(edge: HttpEdge): readonly Route[] {
  return [
    { method: 'POST', path: '/v1/chat/completions', api: true, idPrefix: 'chatcmpl-', handle: (ctx) => chat(edge, ctx) },
    { method: 'POST', path: '/v1/completions', api: true, idPrefix: 'cmpl-', handle: (ctx) => completions(edge, ctx) },
    { method: 'POST', path: '/v1/embeddings', api: true, handle: (ctx) => embeddings(edge, ctx) },
    { method: 'GET', path: '/v1/models', api: true, handle: (ctx) => models(edge, ctx) },
    { method: 'GET', path: '/v1/models/{id}', api: true, handle: (ctx) => model(edge, ctx) },
    { method: 'GET', path: '/v1/passages', api: true, handle: (ctx) => passages(edge, ctx) },
    { method: 'GET', path: '/metrics', api: false, handle: (ctx) => metrics(edge, ctx) },
    { method: 'GET', path: '/healthz', api: false, handle: (ctx) => sendJson(ctx.res, 200, { status: 'ok' }) },
    { method: 'GET', path: '/readyz', api: false, handle: (ctx) => ready(edge, ctx) },
  ];
}

function models(edge: HttpEdge, ctx: RequestContext): void {
  sendJson(ctx.res, 200, { object: 'list', data: [...edge.workers.keys(), ...edge.embedders.keys()].map(modelObject) });
}

function model(edge: HttpEdge, ctx: RequestContext): void {
  const id = decodeURIComponent(ctx.path.slice('/v1/models/'.length));
  if (!edge.workers.has(id) && !edge.embedders.has(id))
    throw new ApiError(404, `The model \`${id}\` does not exist.`, 'invalid_request_error', 'model_not_found', 'model');
  sendJson(ctx.res, 200, modelObject(id));
}

/** `?source=`: the passages cited under a source (`file › heading`). */
function passages(edge: HttpEdge, ctx: RequestContext): void {
  const find = edge.config.passages;
  if (find === undefined) throw new ApiError(404, 'This server has no corpus.', 'invalid_request_error', 'not_found');
  const source = new URL(ctx.req.url ?? '/', 'http://x').searchParams.get('source');
  if (source === null || source === '')
    throw new ApiError(400, 'Give the cited source: ?source=<file › heading>.', 'invalid_request_error', 'missing_source', 'source');
  const found = find(source);
  if (found.length === 0) throw new ApiError(404, `No passage has the source \`${source}\`.`, 'invalid_request_error', 'passage_not_found', 'source');
  sendJson(ctx.res, 200, { object: 'list', data: found.map((p) => ({ object: 'passage', id: p.id, source: p.source, text: p.text })) });
}

async function metrics(edge: HttpEdge, ctx: RequestContext): Promise<void> {
  const registry = edge.config.metrics;
  if (registry === undefined) throw new ApiError(404, 'Metrics are not enabled.', 'invalid_request_error', 'not_found');
  const { contentType, body } = await registry.scrape(headerValue(ctx.req.headers.accept));
  ctx.res.writeHead(200, { 'content-type': contentType });
  ctx.res.end(body);
}

/** 200 once the models are loaded, 503 while loading or draining. */
function ready(edge: HttpEdge, ctx: RequestContext): void {
  const ok = !edge.draining && (edge.config.ready?.() ?? true);
  sendJson(ctx.res, ok ? 200 : 503, { status: ok ? 'ready' : edge.draining ? 'draining' : 'loading' });
}

function modelObject(id: string): { id: string; object: 'model'; created: number; owned_by: string } {
  return { id, object: 'model', created: 0, owned_by: 'sluice' };
}
