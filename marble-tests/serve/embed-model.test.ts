/**
 * A user's own sentence-embedding model by path (`--embed-model DIR`): the directory read and
 * checked (`loadEmbeddingDir`), and `sluice serve` embedding the corpus, the questions and
 * `/v1/embeddings` with it, over real sockets on 127.0.0.1.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EmbeddingDirError, loadEmbeddingDir } from '../../src/ai/models/embedding-dir.js';
import { ModelNotFoundError } from '../../src/ai/models/errors.js';
import { startServer, type RunningServer } from '../../src/serve/app.js';
import { serveOptions } from '../../src/cli.js';
import { EMBED_DIM, embedModelDir, type EmbedModelDir } from '../support/embed-model-dir.js';

const WORDS = ['the', 'fox', 'jumps', 'over', 'lazy', 'dog', 'bread', 'oven', 'bake', 'flour', 'how', 'do', 'i', 'a', 'at', 'degrees', 'hot'];

describe('loadEmbeddingDir', () => {
  it('reads the pooling of 1_Pooling/config.json and the Normalize of modules.json', async () => {
    const mean = await embedModelDir('mini', { words: WORDS });
    const cls = await embedModelDir('cls', { words: WORDS, mode: 'pooling_mode_cls_token', normalize: false });
    const bare = await embedModelDir('bare', { words: WORDS, without: ['1_Pooling/config.json', 'modules.json'] });
    try {
      const loaded = await loadEmbeddingDir(mean.dir);
      assert.equal(loaded.name, 'mini');
      assert.match(loaded.modelPath, /onnx[/\\]model\.onnx$/);
      assert.deepEqual(loaded.pooling, { pooling: 'mean', normalize: true });
      assert.deepEqual(loaded.tokenizer.encode('The fox'), [2, 4, 5, 3]);
      assert.deepEqual((await loadEmbeddingDir(cls.dir)).pooling, { pooling: 'cls', normalize: false });
      assert.deepEqual((await loadEmbeddingDir(bare.dir)).pooling, {}, 'no pooling files: the defaults');
    } finally {
      await Promise.all([mean.remove(), cls.remove(), bare.remove()]);
    }
  });

  it('a bad directory fails naming the file: not a directory, no model, no tokenizer, a pooling sluice cannot apply', async () => {
    const max = await embedModelDir('max', { words: WORDS, mode: 'pooling_mode_max_tokens' });
    const noModel = await embedModelDir('no-model', { words: WORDS, without: ['model'] });
    const noTokenizer = await embedModelDir('no-tokenizer', { words: WORDS, without: ['tokenizer.json'] });
    try {
      await assert.rejects(loadEmbeddingDir(join(max.dir, 'nope')), (e: unknown) => e instanceof EmbeddingDirError && /is not a directory/.test(e.message));
      await assert.rejects(loadEmbeddingDir(noModel.dir), (e: unknown) => e instanceof EmbeddingDirError && /model\.onnx/.test(e.message));
      await assert.rejects(loadEmbeddingDir(noTokenizer.dir), (e: unknown) => e instanceof ModelNotFoundError && /tokenizer\.json/.test(e.message));
      await assert.rejects(
        loadEmbeddingDir(max.dir),
        (e: unknown) =>
          e instanceof EmbeddingDirError && e.code === 'EMBEDDING_MODEL_INVALID' && /1_Pooling.config\.json: pooling_mode_max_tokens/.test(e.message),
      );
    } finally {
      await Promise.all([max.remove(), noModel.remove(), noTokenizer.remove()]);
    }
  });

  it('the CLI reads --embed-model and SLUICE_EMBED_MODEL', () => {
    assert.equal(serveOptions(['--embed-model', '/models/minilm'], {}).embedModel, '/models/minilm');
    assert.equal(serveOptions([], { SLUICE_EMBED_MODEL: '/models/minilm' }).embedModel, '/models/minilm');
  });
});

describe('sluice serve --embed-model', () => {
  let model: EmbedModelDir;
  let corpus: string;
  let models: string;
  let server: RunningServer;

  before(async () => {
    model = await embedModelDir('mini', { words: WORDS });
    corpus = await mkdtemp(join(tmpdir(), 'sluice-embed-corpus-'));
    models = await mkdtemp(join(tmpdir(), 'sluice-embed-models-'));
    await writeFile(join(corpus, 'fox.md'), '# Fox\n\nThe fox jumps over the lazy dog.\n');
    await writeFile(join(corpus, 'bread.md'), '# Bread\n\nBake the bread in a hot oven at 220 degrees.\n');
    server = await startServer({ port: 0, models, corpus, embedModel: model.dir, poolSize: 1 });
  });
  after(async () => {
    await server?.shutdown();
    await model?.remove();
    await rm(corpus, { recursive: true, force: true });
    await rm(models, { recursive: true, force: true });
  });

  it('/v1/embeddings answers with the user model: its width, its pooling, normalised', async () => {
    const res = await fetch(`${server.url}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sluice-embed', input: ['the fox', 'bake bread'] }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    const body = (await res.json()) as { data: { embedding: number[] }[]; usage: { prompt_tokens: number } };
    assert.equal(body.data.length, 2);
    const expected = [model.expected([2, 4, 5, 3]), model.expected([2, 12, 10, 3])];
    body.data.forEach((d, i) => {
      assert.equal(d.embedding.length, EMBED_DIM);
      d.embedding.forEach((v, j) => assert.ok(Math.abs(v - expected[i]![j]!) < 1e-5, `text ${i}, dim ${j}: ${v} vs ${expected[i]![j]}`));
    });
    assert.equal(body.usage.prompt_tokens, 8, "counted with the model's own tokenizer");
  });

  it('sluice-rag answers over the corpus it embedded', async () => {
    const res = await fetch(`${server.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sluice-rag', messages: [{ role: 'user', content: 'How hot is the oven to bake bread?' }] }),
    });
    assert.equal(res.status, 200, await res.clone().text());
    const body = (await res.json()) as { choices: { message: { content: string } }[] };
    assert.match(body.choices[0]!.message.content, /bread\.md/);
  });
});
