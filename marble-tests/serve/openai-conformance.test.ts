/**
 * Every object the OpenAI-compatible API answers, checked field by field against OpenAI's API
 * spec (openai-openapi: CreateChatCompletionResponse, CreateChatCompletionStreamResponse,
 * CreateCompletionResponse, CompletionUsage, Error), for every model a server lists: the embedded
 * ones (real onnxruntime) and a gateway model whose upstream sends only the fields it must.
 * A required field must be there (`refusal: null`, `logprobs: null`); an optional one, when sent,
 * must have the spec's type (`system_fingerprint` a string, never null).
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import * as z from 'zod';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { FakeUpstream } from '../support/fake-upstream.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

const count = z.number().int().min(0);
const usage = z
  .object({
    prompt_tokens: count,
    completion_tokens: count,
    total_tokens: count,
    prompt_tokens_details: z.looseObject({}).optional(),
    completion_tokens_details: z.looseObject({}).optional(),
  })
  .strict()
  .refine((u) => u.total_tokens === u.prompt_tokens + u.completion_tokens, { error: 'total_tokens is not prompt_tokens + completion_tokens' });
const logprobs = z.union([z.null(), z.looseObject({})]);
const chatFinish = z.enum(['stop', 'length', 'tool_calls', 'content_filter', 'function_call']);
const textFinish = z.enum(['stop', 'length', 'content_filter']);
/** Fields every response object has; the optional ones with the spec's types. */
const head = {
  id: z.string().min(1),
  created: count,
  model: z.string().min(1),
  system_fingerprint: z.string().optional(),
  service_tier: z.enum(['auto', 'default', 'flex', 'scale', 'priority']).nullable().optional(),
};

const chatCompletion = z
  .object({
    ...head,
    object: z.literal('chat.completion'),
    choices: z
      .array(
        z
          .object({
            index: count,
            message: z.looseObject({
              role: z.literal('assistant'),
              content: z.string().nullable(),
              refusal: z.string().nullable(),
              tool_calls: z.array(z.looseObject({ id: z.string(), type: z.string() })).optional(),
            }),
            logprobs,
            finish_reason: chatFinish,
          })
          .strict(),
      )
      .min(1),
    usage: usage.optional(),
  })
  .strict();

const chatChunk = z
  .object({
    ...head,
    object: z.literal('chat.completion.chunk'),
    choices: z.array(
      z
        .object({
          index: count,
          delta: z.looseObject({
            role: z.literal('assistant').optional(),
            content: z.string().nullable().optional(),
            refusal: z.string().nullable().optional(),
            tool_calls: z.array(z.looseObject({ index: count })).optional(),
          }),
          logprobs: logprobs.optional(),
          finish_reason: chatFinish.nullable(),
        })
        .strict(),
    ),
    usage: usage.nullable().optional(),
  })
  .strict();

const textChoice = (finish: z.ZodType) => z.object({ text: z.string(), index: count, logprobs, finish_reason: finish }).strict();
const textCompletion = z
  .object({ ...head, object: z.literal('text_completion'), choices: z.array(textChoice(textFinish)).min(1), usage: usage.optional() })
  .strict();
const textChunk = z
  .object({ ...head, object: z.literal('text_completion'), choices: z.array(textChoice(textFinish.nullable())), usage: usage.nullable().optional() })
  .strict();
const errorBody = z
  .object({ error: z.object({ message: z.string().min(1), type: z.string().min(1), param: z.string().nullable(), code: z.string().nullable() }).strict() })
  .strict();

function conforms(schema: z.ZodType, value: unknown, what: string): void {
  const result = schema.safeParse(value);
  assert.ok(result.success, `${what} does not follow OpenAI's spec:\n${result.success ? '' : z.prettifyError(result.error)}\n${JSON.stringify(value)}`);
}

async function post(base: string, path: string, body: unknown): Promise<Response> {
  return fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

/** The `data:` payloads of an SSE body, `[DONE]` left out (and required last). */
async function events(response: Response): Promise<unknown[]> {
  const text = await response.text();
  const data = text
    .split('\n\n')
    .filter((block) => block.startsWith('data: '))
    .map((block) => block.slice('data: '.length));
  assert.equal(data.at(-1), '[DONE]', 'a stream ends with [DONE]');
  return data.slice(0, -1).map((d) => JSON.parse(d) as unknown);
}

const messages = [{ role: 'user', content: 'How does a stage pause a fast producer?' }];

describe("OpenAI's spec, field by field, for every model served", () => {
  let models: GeneratedModels;
  let upstream: FakeUpstream;
  let embedded: RunningServer;
  let gateway: RunningServer;
  /** Every chat model, with the server that serves it. */
  let targets: { base: string; model: string; gateway: boolean }[];

  before(async () => {
    models = await generatedModels('conformance');
    upstream = await FakeUpstream.start(['up-model']);
    embedded = await startServer({ port: 0, models: models.dir, poolSize: 1, inspect: false });
    gateway = await startServer({ port: 0, upstreams: [{ baseUrl: upstream.url, models: ['up-model'] }], inspect: false });
    const chatModels = embedded.models.filter((m) => m !== 'sluice-embed');
    assert.ok(chatModels.includes('sluice-rag') && chatModels.includes('charlm'), embedded.models.join(', '));
    targets = [
      ...chatModels.map((model) => ({ base: embedded.url, model, gateway: false })),
      ...gateway.models.map((model) => ({ base: gateway.url, model, gateway: true })),
    ];
  });
  after(async () => {
    await gateway?.shutdown(0);
    await embedded?.shutdown(0);
    await upstream?.close();
    await models?.remove();
  });

  it('a whole chat.completion: message with role, content and refusal (null), logprobs null, finish_reason, usage', async () => {
    for (const { base, model } of targets) {
      const response = await post(base, '/v1/chat/completions', { model, messages, max_tokens: 6 });
      const body = (await response.json()) as { choices: { message: { refusal: unknown } }[] };
      assert.equal(response.status, 200, `${model}: ${JSON.stringify(body)}`);
      conforms(chatCompletion, body, `${model}: chat.completion`);
      assert.equal(body.choices[0]!.message.refusal, null, `${model}: no refusal`);
    }
  });

  it('streamed chat.completion.chunk events, then a usage chunk with no choices', async () => {
    for (const { base, model } of targets) {
      const response = await post(base, '/v1/chat/completions', { model, messages, max_tokens: 6, stream: true, stream_options: { include_usage: true } });
      assert.equal(response.status, 200, model);
      const chunks = (await events(response)) as { choices: { finish_reason: unknown }[]; usage?: unknown }[];
      assert.ok(chunks.length >= 3, `${model}: ${chunks.length} chunks`);
      for (const chunk of chunks) conforms(chatChunk, chunk, `${model}: chat.completion.chunk`);
      const last = chunks.at(-1)!;
      assert.deepEqual(last.choices, [], `${model}: the usage chunk has no choices`);
      assert.ok(last.usage !== undefined && last.usage !== null, `${model}: the usage chunk has usage`);
      assert.notEqual(chunks.at(-2)!.choices[0]!.finish_reason, null, `${model}: the last choice chunk has its finish_reason`);
    }
  });

  it('text_completion objects, whole and streamed, for the models served here', async () => {
    for (const { base, model } of targets.filter((t) => !t.gateway)) {
      const whole = await post(base, '/v1/completions', { model, prompt: 'A stage pauses', max_tokens: 6 });
      const body = (await whole.json()) as unknown;
      assert.equal(whole.status, 200, `${model}: ${JSON.stringify(body)}`);
      conforms(textCompletion, body, `${model}: text_completion`);
      const streamed = await post(base, '/v1/completions', {
        model,
        prompt: 'A stage pauses',
        max_tokens: 6,
        stream: true,
        stream_options: { include_usage: true },
      });
      assert.equal(streamed.status, 200, model);
      for (const chunk of await events(streamed)) conforms(textChunk, chunk, `${model}: streamed text_completion`);
    }
  });

  it("a gateway model keeps its upstream's refusal (content then null), and fills in refusal when the upstream leaves it out", async () => {
    upstream.script({ kind: 'stream', deltas: [{ role: 'assistant', refusal: "I can't help with that." }] });
    const refused = await post(gateway.url, '/v1/chat/completions', { model: 'up-model', messages });
    const body = (await refused.json()) as { choices: { message: { content: unknown; refusal: unknown } }[] };
    conforms(chatCompletion, body, 'a refusal');
    assert.equal(body.choices[0]!.message.refusal, "I can't help with that.");
    assert.equal(body.choices[0]!.message.content, null);
    // The fake upstream's chunks carry no refusal field at all.
    const plain = (await (await post(gateway.url, '/v1/chat/completions', { model: 'up-model', messages })).json()) as {
      choices: { message: { content: unknown; refusal: unknown } }[];
    };
    assert.equal(plain.choices[0]!.message.refusal, null);
    assert.equal(plain.choices[0]!.message.content, 'Hello from upstream');
  });

  it('an error object has message, type, param and code, each present', async () => {
    for (const base of [embedded.url, gateway.url]) {
      const missing = await post(base, '/v1/chat/completions', { model: 'no-such-model', messages });
      assert.equal(missing.status, 404);
      conforms(errorBody, await missing.json(), 'a 404');
      const bad = await post(base, '/v1/chat/completions', { model: targets[0]!.model, messages, temperature: 7 });
      assert.equal(bad.status, 400);
      conforms(errorBody, await bad.json(), 'a 400');
    }
  });
});
