/**
 * `response_format` for models served here: `json_object` and `json_schema` answers are
 * validated (one repair attempt: the brackets fixed, else the model asked again with the
 * problem), streamed once valid, or refused with a typed 422 — through the official client.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { createHttpHandler } from '../../src/serve/http.js';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { ScriptedWorker } from 'sluice/testing/ai';

/** Answers each request with the next scripted text, word by word; remembers the requests. */
const answering = (answers: string[]) =>
  new ScriptedWorker({ name: 'scripted', tokens: () => (answers.shift() ?? '').match(/\S+\s*/g) ?? [], inputTokens: 5, maxTokens: 1000 });

const CITY = {
  type: 'json_schema',
  json_schema: {
    name: 'city',
    schema: { type: 'object', properties: { city: { type: 'string' }, people: { type: 'integer' } }, required: ['city'], additionalProperties: false },
  },
} as const;

describe('response_format json_object / json_schema for a model served here', () => {
  let server: Server;
  let client: OpenAI;
  const workers = new Map<string, ScriptedWorker>();
  const worker = (answers: string[]) => {
    const w = answering(answers);
    workers.set('scripted', w);
    return w;
  };

  before(async () => {
    const handler = createHttpHandler({
      workers: {
        scripted: {
          name: 'scripted',
          generate: (r, o) => workers.get('scripted')!.generate(r, o),
        },
      },
    });
    server = createServer(handler);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    client = new OpenAI({ baseURL: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, apiKey: 'x', maxRetries: 0 });
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  it('tells the model the schema, and answers with the valid JSON it gave', async () => {
    const w = worker(['{"city": "Oslo", "people": 709000}']);
    const answer = await client.chat.completions.create({
      model: 'scripted',
      messages: [{ role: 'user', content: 'Capital of Norway?' }],
      response_format: CITY,
    });
    assert.deepEqual(JSON.parse(answer.choices[0]!.message.content!), { city: 'Oslo', people: 709000 });
    assert.equal(w.requests.length, 1);
    const system = w.requests[0]!.messages![0]!;
    assert.equal(system.role, 'system');
    assert.match(system.content, /JSON Schema:\n\{"type":"object"/);
    assert.equal(answer.usage?.completion_tokens, 4);
  });

  it('repairs a fenced answer with a trailing comma without asking again', async () => {
    const w = worker(['Sure!\n```json\n{"city": "Lima",}\n```']);
    const answer = await client.chat.completions.create({
      model: 'scripted',
      messages: [{ role: 'user', content: 'Capital of Peru?' }],
      response_format: CITY,
    });
    assert.deepEqual(JSON.parse(answer.choices[0]!.message.content!), { city: 'Lima' });
    assert.equal(w.requests.length, 1);
  });

  it('asks the model once more, showing its answer and the problem; usage counts both generations', async () => {
    const w = worker(['{"town": "Quito"}', '{"city": "Quito"}']);
    const answer = await client.chat.completions.create({
      model: 'scripted',
      messages: [{ role: 'user', content: 'Capital of Ecuador?' }],
      response_format: CITY,
    });
    assert.deepEqual(JSON.parse(answer.choices[0]!.message.content!), { city: 'Quito' });
    assert.equal(w.requests.length, 2);
    const retry = w.requests[1]!.messages!;
    assert.deepEqual(retry.at(-2), { role: 'assistant', content: '{"town": "Quito"}' });
    assert.match(retry.at(-1)!.content, /^That answer is not valid: .*city/);
    assert.equal(answer.usage?.completion_tokens, 4);
    assert.equal(answer.usage?.prompt_tokens, 10);
  });

  it('an answer still invalid after the repair attempt is a typed 422 naming the path, never a half-valid text', async () => {
    const w = worker(['{"city": 5}', '{"city": 6}']);
    await assert.rejects(
      client.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'x' }], response_format: CITY }),
      (err: unknown) => err instanceof OpenAI.APIError && err.status === 422 && err.code === 'output_invalid' && /city: /.test(err.message),
    );
    assert.equal(w.requests.length, 2);
  });

  it('json_object takes any object; streaming sends it in one piece once valid', async () => {
    worker(['not json at all', '{"ok": true}']);
    const stream = await client.chat.completions.create({
      model: 'scripted',
      messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_object' },
      stream: true,
    });
    const pieces: string[] = [];
    for await (const chunk of stream) if (chunk.choices[0]?.delta.content) pieces.push(chunk.choices[0].delta.content);
    assert.deepEqual(pieces, ['{"ok":true}']);
  });

  it('a schema this server cannot check, or a malformed response_format, is a 400 naming the field', async () => {
    worker([]);
    await assert.rejects(
      client.chat.completions.create({
        model: 'scripted',
        messages: [{ role: 'user', content: 'x' }],
        response_format: { type: 'json_schema', json_schema: { name: 'bad', schema: { type: 'no-such-type' } } },
      }),
      (err: unknown) => err instanceof OpenAI.APIError && err.status === 400 && err.param === 'response_format.json_schema.schema',
    );
    await assert.rejects(
      client.chat.completions.create({ model: 'scripted', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'yaml' } as never }),
      (err: unknown) => err instanceof OpenAI.APIError && err.status === 400 && /response_format/.test(err.message),
    );
  });
});

describe('response_format against the embedded models', () => {
  let running: RunningServer;
  before(async () => {
    running = await startServer({ port: 0, poolSize: 1 });
  });
  after(async () => {
    await running?.shutdown(0);
  });

  it('the toy character model cannot write JSON: a 422 output_invalid after its one repair attempt', async () => {
    const client = new OpenAI({ baseURL: `${running.url}/v1`, apiKey: 'x', maxRetries: 0 });
    await assert.rejects(
      client.chat.completions.create({
        model: 'charlm',
        messages: [{ role: 'user', content: 'Give me JSON' }],
        max_tokens: 24,
        response_format: { type: 'json_object' },
      }),
      (err: unknown) => err instanceof OpenAI.APIError && err.status === 422 && err.code === 'output_invalid',
    );
  });
});
