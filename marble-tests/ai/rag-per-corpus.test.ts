/**
 * What the extractive answer reads of a passage is per corpus, not per question: a passage's
 * sentences, their terms and their vectors are worked out once, and the answers are the same as
 * when everything is computed afresh. Over the real generated embedding model in a worker pool.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { lastValueFrom, toArray } from 'rxjs';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { loadTokenizer } from '../../src/ai/models/load.js';
import { ragWorker } from '../../src/ai/pipelines/rag-worker.js';
import type { PipelineWorker } from '../../src/ai/pipelines/pipeline-worker.js';
import { embedder } from '../../src/ai/pool/embedder.js';
import { InferencePool } from '../../src/ai/pool/pool.js';
import { indexPassages, loadCorpus } from '../../src/ai/rag/corpus.js';
import { EmbeddingCache } from '../../src/ai/rag/embedding-cache.js';
import { EmbedderOutputError } from '../../src/ai/rag/errors.js';
import { sentencesOf } from '../../src/ai/rag/extract.js';
import { lexicalTerm } from '../../src/ai/rag/lexical-index.js';
import { TextMemo } from '../../src/ai/rag/text-memo.js';
import type { PassageMetadata } from '../../src/ai/rag/passage.js';
import type { VectorIndex } from '../../src/ai/rag/vector-index.js';
import type { Embedder } from '../../src/ai/stages/embed.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

async function ask(rag: PipelineWorker, question: string): Promise<string> {
  const tokens = await lastValueFrom(rag.generate(generateRequest({ prompt: question })).pipe(toArray()));
  return tokens.map((t) => t.text).join('');
}

describe('TextMemo', () => {
  it('computes a text once while it is remembered: one used within the last capacity texts added always is', () => {
    const computed: string[] = [];
    const memo = new TextMemo((text) => {
      computed.push(text);
      return text.length;
    }, 2);
    assert.equal(memo.get('ab'), 2);
    assert.equal(memo.get('abc'), 3);
    assert.equal(memo.get('ab'), 2);
    assert.equal(memo.get('abcd'), 4); // the first generation is full: it becomes the old one
    assert.equal(memo.get('ab'), 2); // found in the old generation, moved to the young one
    assert.equal(memo.get('abc'), 3);
    assert.deepEqual(computed, ['ab', 'abc', 'abcd']);
    assert.ok(memo.size <= 2 * memo.capacity);
  });

  it('forgets a text not used for two generations, and computes it again', () => {
    const computed: string[] = [];
    const memo = new TextMemo((text) => {
      computed.push(text);
      return text.toUpperCase();
    }, 1);
    for (const text of ['a', 'b', 'c', 'a']) memo.get(text);
    assert.deepEqual(computed, ['a', 'b', 'c', 'a']);
    assert.equal(memo.get('a'), 'A');
    assert.equal(memo.size, 2);
  });

  it('remembers a null result as a result', () => {
    let calls = 0;
    const memo = new TextMemo(() => (calls++, null), 4);
    assert.equal(memo.get('the'), null);
    assert.equal(memo.get('the'), null);
    assert.equal(calls, 1);
  });

  it('refuses a capacity that is not a positive integer', () => {
    for (const capacity of [0, -1, 1.5, Number.NaN]) assert.throws(() => new TextMemo((t) => t, capacity), RangeError);
  });

  it('lexicalTerm, remembered, gives what it gives the first time', () => {
    const words = ['Policies', 'policy', 'the', 'x', '4', 'keeper', 'Über', 'v2', 'policies'];
    const first = words.map(lexicalTerm);
    assert.deepEqual(words.map(lexicalTerm), first);
    assert.deepEqual(first, ['polici', 'polici', null, null, '4', 'keep', 'uber', 'v2', 'polici']);
  });
});

describe('EmbeddingCache.embed', () => {
  const embedded: string[][] = [];
  // A real embedder of a kind: each text's vector is its length and its first character code.
  const lengths: Embedder = (texts) => {
    embedded.push([...texts]);
    return Promise.resolve(texts.map((t) => Float32Array.from([t.length, t.charCodeAt(0)])));
  };

  it('embeds only the texts it does not hold, each once, in one call, and returns every vector in order', async () => {
    embedded.length = 0;
    const cache = new EmbeddingCache(16);
    const signal = new AbortController().signal;
    const first = await cache.embed(['aa', 'b', 'aa', 'ccc'], lengths, signal);
    assert.deepEqual(
      first.map((v) => [...v]),
      [
        [2, 97],
        [1, 98],
        [2, 97],
        [3, 99],
      ],
    );
    const second = await cache.embed(['ccc', 'dddd', 'b'], lengths, signal);
    assert.deepEqual(
      second.map((v) => [...v]),
      [
        [3, 99],
        [4, 100],
        [1, 98],
      ],
    );
    assert.deepEqual(embedded, [['aa', 'b', 'ccc'], ['dddd']]);
    await cache.embed(['aa', 'dddd'], lengths, signal);
    assert.equal(embedded.length, 2, 'everything held: the embedder is not called');
    assert.equal(cache.hits, 4); // a text twice in one call is looked up once
  });

  it('keeps a copy, not a view into the batch the embedder returned', async () => {
    const batch = new Float32Array([1, 2, 3, 4]);
    const cache = new EmbeddingCache(4);
    const [a] = await cache.embed(['a', 'b'], () => Promise.resolve([batch.subarray(0, 2), batch.subarray(2, 4)]), new AbortController().signal);
    assert.notEqual(a!.buffer, batch.buffer);
    assert.deepEqual([...cache.get('b')!], [3, 4]);
  });

  it('fails with EmbedderOutputError, naming the stage, when the embedder returns the wrong number of vectors', async () => {
    const cache = new EmbeddingCache(4);
    await assert.rejects(
      cache.embed(['a', 'b'], () => Promise.resolve([new Float32Array(2)]), new AbortController().signal, 'assemble'),
      (error: unknown) => error instanceof EmbedderOutputError && /Stage "assemble"/.test(error.message),
    );
    assert.equal(cache.size, 0);
  });
});

describe('ragWorker: per-corpus work done once', () => {
  let models: GeneratedModels;
  let pool: InferencePool;
  let embed: Embedder;
  let index: VectorIndex<PassageMetadata>;
  const workers: PipelineWorker[] = [];

  before(async () => {
    models = await generatedModels('rag-per-corpus');
    pool = await InferencePool.create({ model: join(models.dir, MODEL_FILES.embedding), size: 1 });
    embed = embedder(pool, await loadTokenizer(join(models.dir, MODEL_FILES.embeddingTokenizer)));
    index = await indexPassages(await loadCorpus(), embed);
  });
  after(async () => {
    for (const rag of workers) rag.close();
    await pool?.close();
    await models?.remove();
  });

  it("embeds a retrieved passage's sentences once: a question asked again embeds nothing, and the answer is the same", async () => {
    const asked: string[] = [];
    const counting: Embedder = (texts, signal) => {
      asked.push(...texts);
      return embed(texts, signal);
    };
    const rag = ragWorker({ embedder: counting, index });
    workers.push(rag);
    const question = 'What does shed-oldest do?';
    const first = await ask(rag, question);
    assert.notEqual(first.length, 0);
    const embeddedFirst = asked.length;
    assert.ok(embeddedFirst > 1, 'the question and the sentences of what it retrieved');
    assert.equal(new Set(asked).size, asked.length, 'each text embedded once');
    assert.equal(await ask(rag, question), first);
    assert.equal(asked.length, embeddedFirst, 'nothing embedded again');
    // A question worded otherwise retrieves passages already read: only its own text is new.
    const other = await ask(rag, 'What does shed-oldest do when the buffer is full?');
    assert.ok(asked.length - embeddedFirst < embeddedFirst, `embedded ${asked.slice(embeddedFirst).join(' | ')}`);
    // Its answer is the one a worker that read nothing before gives.
    const fresh = ragWorker({ embedder: embed, index });
    workers.push(fresh);
    assert.equal(await ask(fresh, 'What does shed-oldest do when the buffer is full?'), other);
  });

  it('answers as before when the sentence cache holds fewer sentences than one question reads', async () => {
    const tiny = ragWorker({ embedder: embed, index, sentenceCacheCapacity: 1 });
    const fresh = ragWorker({ embedder: embed, index });
    workers.push(tiny, fresh);
    for (const question of ['How are tokens streamed over WebSocket?', 'How is a request cancelled?', 'How are tokens streamed over WebSocket?'])
      assert.equal(await ask(tiny, question), await ask(fresh, question), question);
  });

  it('splits a passage as sentencesOf does', () => {
    const memo = new TextMemo(sentencesOf, 8);
    for (const [, metadata] of [...index.entries()].slice(0, 5).map((e) => [e.id, e.metadata] as const))
      assert.deepEqual(memo.get(metadata.text), sentencesOf(metadata.text));
  });

  it('refuses a sentence cache capacity below 1, naming the field', () => {
    assert.throws(() => ragWorker({ embedder: embed, index, sentenceCacheCapacity: 0 }), /sentenceCacheCapacity/);
  });
});
