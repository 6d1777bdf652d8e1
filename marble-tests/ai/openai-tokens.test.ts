/** Exact OpenAI token counts (js-tiktoken, the encodings shipped in the package) for assemble's budgets. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import * as z from 'zod';
import { openAiEncodingOf, openAiTokenCounter } from '../../src/ai/inference/openai-tokens.js';
import { PromptTemplate } from '../../src/ai/stages/assemble.js';
import { countTokens } from '../../src/ai/rag/tokens.js';

describe('openAiTokenCounter', () => {
  it('picks the encoding of the model family, snapshots and provider prefixes included; other models have none', () => {
    assert.equal(openAiEncodingOf('gpt-4o-mini'), 'o200k_base');
    assert.equal(openAiEncodingOf('gpt-5'), 'o200k_base');
    assert.equal(openAiEncodingOf('openai/gpt-4.1-mini-2099-01-01'), 'o200k_base');
    assert.equal(openAiEncodingOf('o4-mini'), 'o200k_base');
    assert.equal(openAiEncodingOf('gpt-4'), 'cl100k_base');
    assert.equal(openAiEncodingOf('gpt-3.5-turbo-0125'), 'cl100k_base');
    assert.equal(openAiEncodingOf('llama3.1:8b'), undefined);
    assert.throws(() => openAiTokenCounter('qwen3'), /no OpenAI encoding is known for the model "qwen3"/);
  });

  it('counts with the encoding (o200k and cl100k split differently) and adds the chat format per message', () => {
    const o200k = openAiTokenCounter('gpt-4o');
    const cl100k = openAiTokenCounter('gpt-4');
    assert.equal(o200k.countTokens('hello world'), 2); // [24912, 2375]
    assert.equal(cl100k.countTokens('hello world'), 2); // [15339, 1917]
    const hindi = 'नमस्ते दुनिया, यह एक परीक्षण है';
    assert.ok(cl100k.countTokens(hindi) > o200k.countTokens(hindi), 'o200k has far more non-Latin merges');
    // Special-token text in user content is text, never a special token.
    assert.ok(o200k.countTokens('<|endoftext|>') > 1);
    const messages = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'hello world' },
    ] as const;
    assert.equal(o200k.countPromptTokens!(messages), 3 + (3 + 1 + o200k.countTokens('Be brief.')) + (3 + 1 + 2));
  });

  it('makes assemble budget exactly what the API will bill as prompt tokens', () => {
    const tokenizer = openAiTokenCounter('gpt-4o-mini');
    const passages = [
      { id: 'a', text: 'Stages have bounded buffers; a fast producer is paused.', score: 0.9, source: 'a.md' },
      { id: 'b', text: 'ご注文はうさぎですか？ Cancellation reaches the model between steps.', score: 0.4, source: 'b.md' },
    ];
    const options = { template: 'Context:\n{{context}}\n\nQ: {{q}}', schema: z.object({ q: z.string() }), tokenizer };
    const all = new PromptTemplate({ ...options, budget: 1000 }).render({ q: 'What pauses?' }, passages);
    assert.equal(all.tokens, tokenizer.countPromptTokens!(all.messages));
    assert.notEqual(all.tokens, countTokens(all.messages[0]!.content), 'the estimate differs');
    const tight = new PromptTemplate({ ...options, budget: all.tokens - 1 }).render({ q: 'What pauses?' }, passages);
    assert.deepEqual(tight.dropped, ['b']);
    assert.ok(tight.tokens <= all.tokens - 1 && tight.tokens === tokenizer.countPromptTokens!(tight.messages));
  });
});
