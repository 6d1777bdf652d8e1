/** Documents named by a question: a word of their path, said whole by the question, that few paths share. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { FileNames, subjectWords } from '../../src/ai/rag/file-names.js';
import { LexicalIndex } from '../../src/ai/rag/lexical-index.js';
import { scoreFusion } from '../../src/ai/rag/fusion.js';
import type { PassageMetadata } from '../../src/ai/rag/passage.js';
import { headsApi, retrievePassages } from '../../src/ai/rag/retriever.js';
import { VectorIndex } from '../../src/ai/rag/vector-index.js';

const files = [
  'stemmer/readme.md',
  'punycode/README.md',
  'pino/docs/redaction.md',
  'pino/docs/api.md',
  'undici/docs/api/RetryAgent.md',
  'undici/docs/api/Agent.md',
];

describe('FileNames', () => {
  it('names a document by a whole word of its path that few paths hold, never by a function word, a number or an extension', () => {
    const names = new FileNames();
    for (const file of [...files, ...Array.from({ length: 14 }, (_, i) => `guides/0${i % 10}-part-${i}.md`)]) names.add(file);
    assert.deepEqual([...names.named('Can I load stemmer with require()?', 0.1)], ['stemmer/readme.md']);
    assert.deepEqual([...names.named('How do I configure a RetryAgent?', 0.1)], ['undici/docs/api/RetryAgent.md']);
    assert.deepEqual([...names.named('How do I hide a key?', 0.1)], []);
    assert.deepEqual([...names.named('Does redaction hide a key?', 0.1)], ['pino/docs/redaction.md']);
    assert.deepEqual([...names.named('Does pino hide a key?', 0.1)].sort(), ['pino/docs/api.md', 'pino/docs/redaction.md'], 'pino: 2 paths of 20, a tenth');
    assert.deepEqual([...names.named('Where are the docs?', 0.1)], [], 'docs: 4 paths of 20');
    assert.deepEqual([...names.named('What agents are there?', 0.1)], [], 'whole words only: agents is not Agent');
    assert.deepEqual([...names.named('Which part is the guide about? Is it md?', 0.1)], [], 'part is in 14 paths; guide is not guides; md is an extension');
    assert.deepEqual(subjectWords('guides/01-the-Intro.md'), ['guides', 'intro', 'md']);
  });

  it('stays in step as passages come and go: the same as one built from what is left (random corpora)', () => {
    const file = fc.constantFrom(...files, 'a/b.md', 'a/c.md', 'x-y/z.txt');
    fc.assert(
      fc.property(fc.array(file, { maxLength: 30 }), fc.array(fc.nat(), { maxLength: 30 }), fc.constantFrom(0.1, 0.3, 1), (added, removals, share) => {
        const names = new FileNames();
        for (const f of added) names.add(f);
        const left = [...added];
        for (const r of removals) {
          if (left.length === 0) break;
          const [gone] = left.splice(r % left.length, 1);
          names.remove(gone!);
        }
        const fresh = new FileNames();
        for (const f of left) fresh.add(f);
        assert.equal(names.size, new Set(left).size);
        for (const question of ['stemmer readme', 'RetryAgent agent', 'pino api redaction', 'b c z y']) {
          assert.deepEqual([...names.named(question, share)].sort(), [...fresh.named(question, share)].sort(), question);
        }
      }),
    );
  });
});

describe('hybrid retrieval favours the documents a question names', () => {
  const passages: (PassageMetadata & { id: string; vector: number[] })[] = [
    { id: 's#1', text: 'Load this package from ESM code only.', source: 'stemmer/readme.md › Install', vector: [1, 0] },
    { id: 'p#1', text: 'A CommonJS module you can load from code.', source: 'punycode/README.md › Use', vector: [0.6, 0.8] },
    { id: 'q#1', text: 'Another module, about queues.', source: 'queue/README.md › Use', vector: [0, 1] },
  ];
  const index = new VectorIndex<PassageMetadata>(2);
  for (const { id, vector, ...metadata } of passages) index.add(id, Float32Array.from(vector), metadata);
  const lexical = LexicalIndex.of(passages.map(({ vector: _, ...p }) => p));
  const plan = { index, lexical, mode: 'hybrid' as const, k: 3 };

  it("raises a named document's passages by 15 % of their fused score, and reranks by it", () => {
    const question = 'Can I load stemmer from CommonJS code?';
    const vector = [1, 0];
    const fused = scoreFusion([index.search(vector, { k: 20 }), lexical.search(question, 20), [], []], [0.5, 1, 1, 0.5], [true, true, true, true]);
    const found = retrievePassages(plan, question, vector).passages;
    const fusedScore = (id: string) => fused.find((f) => f.id === id)!.score;
    assert.equal(found.find((p) => p.id === 's#1')!.score, fusedScore('s#1') * 1.15);
    assert.equal(found.find((p) => p.id === 'p#1')!.score, fusedScore('p#1'));
    assert.deepEqual(
      found.map((p) => p.id),
      [...found].sort((a, b) => b.score - a.score).map((p) => p.id),
    );
    assert.ok(fusedScore('p#1') > fusedScore('s#1') && found[0]!.id === 's#1', 'punycode first when fused alone; stemmer, named, first after');
  });

  it('leaves dense and lexical retrieval as they rank', () => {
    const question = 'Can I load stemmer from CommonJS code?';
    assert.equal(retrievePassages({ ...plan, mode: 'dense' }, question, [0.6, 0.8]).passages[0]!.id, 'p#1');
    const lexicalOnly = retrievePassages({ ...plan, mode: 'lexical' }, question, undefined).passages;
    assert.deepEqual(lexicalOnly, retrievePassages({ ...plan, mode: 'lexical' }, question, undefined).passages);
    assert.ok(lexicalOnly.every((p, i) => i === 0 || p.score <= lexicalOnly[i - 1]!.score));
  });
});

describe('hybrid retrieval favours the section headed by an API the question names', () => {
  it('reads an API heading by its name, with its label or its parameters, never a longer name', () => {
    const members = ['readable.pipe'];
    for (const heading of ['stream › readable.pipe(destination[, options])', 'stream › `readable.pipe`', 'x › Method: readable.pipe (dest)'])
      assert.equal(headsApi(heading, members), true, heading);
    for (const heading of ['stream › readable.pipeline()', 'stream › readable.unpipe()', 'stream › Piping readable streams', undefined])
      assert.equal(headsApi(heading, members), false, String(heading));
  });

  it("raises the API's section by 15 % of its fused score, and reranks by it", () => {
    const passages: (PassageMetadata & { id: string; vector: number[] })[] = [
      {
        id: 'w#1',
        text: 'When true, closing this readable does not close the writable it pipes to.',
        source: 'webstreams.md › readableStream.pipeTo(destination)',
        headings: 'Web streams › readableStream.pipeTo(destination)',
        vector: [1, 0],
      },
      {
        id: 's#1',
        text: 'If the readable errors, the writable it pipes to is not closed automatically.',
        source: 'stream.md › readable.pipe(destination[, options])',
        headings: 'Stream › readable.pipe(destination[, options])',
        vector: [0.6, 0.8],
      },
    ];
    const index = new VectorIndex<PassageMetadata>(2);
    for (const { id, vector, ...metadata } of passages) index.add(id, Float32Array.from(vector), metadata);
    const lexical = LexicalIndex.of(passages.map(({ vector: _, ...p }) => p));
    const plan = { index, lexical, mode: 'hybrid' as const, k: 2 };
    const question = 'Does readable.pipe close the writable it pipes to?';
    const fused = scoreFusion([index.search([1, 0], { k: 20 }), lexical.search(question, 20), [], []], [0.5, 1, 1, 0.5], [true, true, true, true]);
    const fusedScore = (id: string) => fused.find((f) => f.id === id)!.score;
    assert.ok(fusedScore('w#1') > fusedScore('s#1'), 'the web stream first when fused alone');
    const found = retrievePassages(plan, question, [1, 0]).passages;
    assert.equal(found[0]!.id, 's#1');
    assert.equal(found[0]!.score, fusedScore('s#1') * 1.15);
    assert.equal(retrievePassages(plan, 'Does the readable pipe close the writable it pipes to?', [1, 0]).passages[0]!.id, 'w#1');
  });
});
