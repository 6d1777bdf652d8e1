/**
 * The Vercel AI SDK as a client of `sluice serve`: its OpenAI-compatible provider (the one users
 * point at vLLM, Ollama or LiteLLM) parses our chunks with its own schemas, so this checks the wire
 * format against a second official client beside OpenAI's.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { APICallError, embedMany, generateText, jsonSchema, streamText, tool } from 'ai';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import type { RequestLogEntry } from '../../src/serve/request-log.js';
import { until } from '../support/ws-client.js';

describe('the Vercel AI SDK (ai 6, @ai-sdk/openai-compatible) against sluice serve', () => {
  let models: string;
  let running: RunningServer;
  const log: RequestLogEntry[] = [];
  let provider: ReturnType<typeof createOpenAICompatible>;

  before(async () => {
    models = await mkdtemp(join(tmpdir(), 'sluice-ai-sdk-'));
    running = await startServer({ port: 0, models, poolSize: 1, requestLog: (entry) => log.push(entry) });
    provider = createOpenAICompatible({ name: 'sluice', baseURL: `${running.url}/v1`, includeUsage: true });
  });
  after(async () => {
    await running.shutdown(1000);
    await rm(models, { recursive: true, force: true });
  });

  it('streamText reads the token stream, its finish reason and usage', async () => {
    const result = streamText({ model: provider('charlm'), prompt: 'The stage', maxOutputTokens: 8 });
    let text = '';
    for await (const delta of result.textStream) text += delta;
    assert.ok(text.length > 0);
    assert.equal(await result.finishReason, 'length');
    const usage = await result.usage;
    assert.equal(usage.outputTokens, 8);
    assert.ok((usage.inputTokens ?? 0) > 0);
  });

  it('generateText gets sluice-rag’s cited answer, with every sampling setting the SDK sends', async () => {
    const result = await generateText({
      model: provider('sluice-rag'),
      prompt: 'How does a stage pause a fast producer?',
      maxOutputTokens: 40,
      temperature: 0.5,
      topP: 0.9,
      presencePenalty: 0,
      frequencyPenalty: 0,
      seed: 1,
    });
    assert.match(result.text, /\[\d\]/, 'cites a source');
    assert.equal(result.usage.outputTokens, 40);
  });

  it('its completion model uses /v1/completions, and its embedding model /v1/embeddings', async () => {
    const completion = await generateText({ model: provider.completionModel('charlm'), prompt: 'The stage', maxOutputTokens: 5 });
    assert.equal(completion.usage.outputTokens, 5);
    assert.ok(log.some((entry) => entry.id.startsWith('cmpl-') && entry.outcome === 'completed'));
    const { embeddings } = await embedMany({ model: provider.textEmbeddingModel('sluice-embed'), values: ['backpressure', 'a stage'] });
    assert.equal(embeddings.length, 2);
    assert.ok(embeddings[0]!.length > 0);
    const norm = Math.hypot(...embeddings[0]!);
    assert.ok(Math.abs(norm - 1) < 1e-3, `unit vector, norm ${norm}`);
  });

  it('a tool the model cannot call is a 400 the SDK reports with its parameter', async () => {
    const tools = {
      weather: tool({ description: 'weather', inputSchema: jsonSchema<{ city: string }>({ type: 'object', properties: { city: { type: 'string' } } }) }),
    };
    await assert.rejects(
      generateText({ model: provider('charlm'), prompt: 'Weather in Oslo?', tools, maxRetries: 0 }),
      (err: unknown) => APICallError.isInstance(err) && err.statusCode === 400 && /'tools'/.test(err.message),
    );
  });

  it('aborting the SDK’s stream ends the generation on the server (logged aborted, before max_tokens)', async () => {
    const controller = new AbortController();
    const before = log.length;
    const result = streamText({ model: provider('charlm'), prompt: 'The stage', maxOutputTokens: 2000, abortSignal: controller.signal });
    let deltas = 0;
    // The SDK ends its text stream quietly on abort (its onAbort callback is what reports it).
    for await (const _ of result.textStream) if (++deltas === 3) controller.abort();
    assert.equal(deltas, 3);
    await until(() => log.slice(before).some((entry) => entry.model === 'charlm'), 'the log line of the aborted request');
    const entry = log.slice(before).find((e) => e.model === 'charlm')!;
    assert.equal(entry.outcome, 'aborted');
    assert.ok((entry.outputTokens ?? 0) < 2000, `made ${entry.outputTokens} tokens`);
  });
});
