/**
 * A prompt is counted against the model's context before anything is decoded: one that does not
 * fit — or does not leave room for the `max_tokens` asked — is OpenAI's 400
 * `context_length_exceeded` over HTTP (streamed or not) and a `CONTEXT_LENGTH_EXCEEDED` error frame
 * over WebSocket, never an empty answer with `finish_reason: "length"`. For every model kind: the
 * generated ONNX decoder (256 positions), a `--model` directory (the real Qwen3 tokenizer and
 * template, a 256-position decoder) and `sluice-rag` answering with it, and a decoder served by a
 * worker over a real nats-server, whose error crosses the wire typed.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import * as fc from 'fast-check';
import { lastValueFrom, toArray } from 'rxjs';
import { ContextLengthExceededError } from '../../src/ai/inference/errors.js';
import { CharLmWorker, DecoderLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { generateRequest, type GenerationDone, type ModelWorker, type Token } from '../../src/ai/inference/worker.js';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { openModelLink, remoteModel, serveModel } from '../../src/nats.js';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { createHttpHandler } from '../../src/serve/http.js';
import { attachTokenSocket } from '../../src/serve/ws-server.js';
import { qwenModelDir } from '../support/local-model-dir.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { startNatsServer, type NatsServer } from '../support/nats-server.js';
import { WsClient, until } from '../support/ws-client.js';

const CONTEXT = 256;
/** 5,000 tokens for the ASCII decoder (a character each); more for the Qwen tokenizer's words too. */
const LONG = 'x '.repeat(2_500);

interface Served {
  readonly base: string;
  readonly ws: string;
  close(): Promise<void>;
}

/** `workers` behind the HTTP API and the WebSocket protocol, on 127.0.0.1. */
async function serve(workers: Record<string, ModelWorker>): Promise<Served> {
  const server: Server = createServer(createHttpHandler({ workers }));
  const sockets = attachTokenSocket(server, { workers, path: '/v1/ws' });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    base: `http://127.0.0.1:${port}`,
    ws: `ws://127.0.0.1:${port}/v1/ws`,
    close: async () => {
      await sockets.drain(0);
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

async function post(base: string, path: string, body: unknown): Promise<{ status: number; text: string }> {
  const response = await fetch(`${base}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: response.status, text: await response.text() };
}

/** Over HTTP, whole and streamed, chat and text completions, and over WebSocket: a too-long prompt is refused alike. */
async function refusesEverywhere(served: Served, model: string, contextLength: number): Promise<void> {
  const messages = [{ role: 'user', content: LONG }];
  const asked = [
    { path: '/v1/chat/completions', body: { model, messages }, param: 'messages' },
    { path: '/v1/chat/completions', body: { model, messages, stream: true }, param: 'messages' },
    { path: '/v1/completions', body: { model, prompt: LONG, max_tokens: 8 }, param: 'prompt' },
    { path: '/v1/completions', body: { model, prompt: LONG, max_tokens: 8, stream: true }, param: 'prompt' },
  ];
  for (const { path, body, param } of asked) {
    const answer = await post(served.base, path, body);
    const what = `${model} ${path}${'stream' in body ? ' (stream)' : ''}`;
    assert.equal(answer.status, 400, `${what}: ${answer.text.slice(0, 300)}`);
    const { error } = JSON.parse(answer.text) as { error: { message: string; type: string; param: string | null; code: string } };
    assert.equal(error.code, 'context_length_exceeded', what);
    assert.equal(error.type, 'invalid_request_error', what);
    assert.equal(error.param, param, what);
    assert.match(error.message, new RegExp(`^This model's maximum context length is ${contextLength} tokens\\. However, `), what);
  }
  const client = await WsClient.open(served.ws);
  try {
    client.send({ type: 'generate', id: 'long', model, messages });
    await until(() => client.end('long') !== undefined, 'the end of the long request');
    const end = client.end('long')!;
    assert.equal(end.type, 'error', `${model} over WebSocket: ${JSON.stringify(end)}`);
    assert.equal((end as { code: string }).code, 'CONTEXT_LENGTH_EXCEEDED');
    assert.equal(client.text('long'), '', 'no token before the error');
  } finally {
    client.ws.close();
  }
}

describe('a prompt longer than the model’s context', () => {
  let generated: GeneratedModels;
  let decoder: DecoderLmWorker;

  before(async () => {
    generated = await generatedModels('context');
    decoder = await DecoderLmWorker.load(join(generated.dir, MODEL_FILES.decoder), { name: 'decoder' });
  });
  after(async () => {
    await decoder?.release();
    await generated?.remove();
  });

  it('the ONNX decoder: refused before decoding iff the prompt leaves no room, or none for max_tokens; otherwise an answer within the context (property)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 320 }),
        fc.option(fc.integer({ min: 1, max: 320 }), { nil: undefined }),
        fc.integer({ min: 0, max: 1_000 }),
        async (promptTokens, maxTokens, seed) => {
          const request = generateRequest({ prompt: 'a'.repeat(promptTokens), seed, ...(maxTokens !== undefined && { max_tokens: maxTokens }) });
          let done: GenerationDone | undefined;
          const outcome = await lastValueFrom(decoder.generate(request, { onDone: (d) => (done = d) }).pipe(toArray())).then(
            (tokens: Token[]) => ({ tokens }),
            (error: unknown) => ({ error }),
          );
          const overflows = promptTokens >= CONTEXT || (maxTokens !== undefined && promptTokens + maxTokens > CONTEXT);
          if (overflows) {
            assert.ok(
              'error' in outcome && outcome.error instanceof ContextLengthExceededError,
              'error' in outcome ? `expected a context error, got ${String(outcome.error)}` : `expected a context error, got ${outcome.tokens.length} tokens`,
            );
            assert.equal(outcome.error.contextLength, CONTEXT);
            assert.equal(outcome.error.promptTokens, promptTokens);
            assert.equal(outcome.error.param, 'prompt');
            assert.equal(done?.usage.outputTokens, 0, 'nothing was decoded');
            return;
          }
          assert.ok('tokens' in outcome, `refused a request that fits: ${String((outcome as { error: unknown }).error)}`);
          assert.ok(outcome.tokens.length >= 1, 'an empty answer');
          assert.ok(promptTokens + done!.usage.outputTokens <= CONTEXT, 'decoded past the context');
          assert.equal(done!.usage.outputTokens, Math.min(maxTokens ?? 256, CONTEXT - promptTokens));
        },
      ),
      { numRuns: 40 },
    );
  });

  it('the ONNX decoder over HTTP and WebSocket: 400 context_length_exceeded, an error frame; a request that fits is answered', async () => {
    const served = await serve({ decoder });
    try {
      await refusesEverywhere(served, 'decoder', CONTEXT);
      const tooMuch = await post(served.base, '/v1/chat/completions', {
        model: 'decoder',
        messages: [{ role: 'user', content: 'a'.repeat(200) }],
        max_tokens: 100,
      });
      assert.equal(tooMuch.status, 400, tooMuch.text);
      assert.match(
        tooMuch.text,
        /However, you requested 300 tokens \(200 in the messages, 100 in the completion\)\. Please reduce the length of the messages or completion\./,
      );
      const fits = await post(served.base, '/v1/chat/completions', {
        model: 'decoder',
        messages: [{ role: 'user', content: 'a'.repeat(200) }],
        max_tokens: 56,
      });
      assert.equal(fits.status, 200, fits.text);
      assert.notEqual((JSON.parse(fits.text) as { choices: { message: { content: string } }[] }).choices[0]!.message.content, '');
    } finally {
      await served.close();
    }
  });

  it('a model with no context limit (charlm reads its last characters) answers a long prompt, never with an empty text', async () => {
    const charlm = await CharLmWorker.load(join(generated.dir, MODEL_FILES.charLm));
    const served = await serve({ charlm });
    try {
      const answer = await post(served.base, '/v1/chat/completions', { model: 'charlm', messages: [{ role: 'user', content: LONG }], max_tokens: 8 });
      assert.equal(answer.status, 200, answer.text);
      const body = JSON.parse(answer.text) as { choices: { message: { content: string }; finish_reason: string }[] };
      assert.equal(body.choices[0]!.message.content.length, 8);
    } finally {
      await served.close();
      await charlm.release();
    }
  });

  describe('sluice serve --model (a 256-position decoder with the Qwen3 tokenizer), and sluice-rag answering with it', () => {
    let model: { dir: string; remove(): Promise<void> };
    let running: RunningServer;

    before(async () => {
      model = await qwenModelDir('short-qwen', { decoder: { maxPositions: CONTEXT } });
      running = await startServer({ port: 0, models: generated.dir, poolSize: 1, localModels: [model.dir], inspect: false });
    });
    after(async () => {
      await running?.shutdown(0);
      await model?.remove();
    });

    it('the model itself: 400 context_length_exceeded and an error frame', async () => {
      await refusesEverywhere({ base: running.url, ws: running.wsUrl, close: async () => {} }, 'short-qwen', CONTEXT);
    });

    it("sluice-rag fits its prompt to the model's context (a question is answered) and refuses a question too long for it", async () => {
      const asked = await post(running.url, '/v1/chat/completions', {
        model: 'sluice-rag',
        messages: [{ role: 'user', content: 'How does a stage pause a fast producer?' }],
        max_tokens: 8,
      });
      assert.equal(asked.status, 200, asked.text);
      const long = await post(running.url, '/v1/chat/completions', { model: 'sluice-rag', messages: [{ role: 'user', content: LONG }] });
      assert.equal(long.status, 400, long.text);
      const { error } = JSON.parse(long.text) as { error: { code: string; param: string } };
      assert.equal(error.code, 'context_length_exceeded');
      assert.equal(error.param, 'messages');
    });
  });

  describe('a decoder on a worker over NATS', () => {
    let nats: NatsServer;
    let workerSide: NatsConnection;
    let requester: NatsConnection;

    before(async () => {
      nats = await startNatsServer();
      workerSide = await connect({ servers: nats.url });
      requester = await connect({ servers: nats.url });
    });
    after(async () => {
      await requester?.close();
      await workerSide?.close();
      await nats?.close();
    });

    it('the worker refuses before decoding; the requester raises the same ContextLengthExceededError, a 400 over HTTP, an error frame over WebSocket', async () => {
      const serving = serveModel(await openModelLink(workerSide, { name: 'remote-decoder', capacity: 8, creditInterval: 50 }), decoder);
      const remote = remoteModel(await openModelLink(requester, { name: 'remote-decoder', capacity: 8, creditInterval: 50 }), { name: 'remote' });
      const served = await serve({ remote });
      try {
        const error = await lastValueFrom(remote.generate(generateRequest({ prompt: 'a'.repeat(300), max_tokens: 4 }))).then(
          () => undefined,
          (err: unknown) => err,
        );
        assert.ok(error instanceof ContextLengthExceededError, `got ${String(error)}`);
        assert.deepEqual([error.contextLength, error.promptTokens, error.param, error.model], [CONTEXT, 300, 'prompt', 'remote']);
        await refusesEverywhere(served, 'remote', CONTEXT);
        const fits = await post(served.base, '/v1/completions', { model: 'remote', prompt: 'abc', max_tokens: 4 });
        assert.equal(fits.status, 200, fits.text);
      } finally {
        await served.close();
        serving.stop();
        await serving.done;
      }
    });
  });
});
