/** Extractive answers (src/ai/rag/extract.ts): sentences out of passages, ranked, cited, in reading order. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { cosineSimilarity } from '../../src/cache/semantic.js';
import { NO_ANSWER, answerPieces, candidatesOf, composeAnswer, cosinesTo, sentencesOf } from '../../src/ai/rag/extract.js';
import type { RetrievedPassage } from '../../src/ai/rag/passage.js';

const v = (...xs: number[]) => Float32Array.from(xs);

describe('extractive answers', () => {
  it('splits prose into sentences, leaving out headings, list markers, separators and fragments', () => {
    const text =
      '# Title\nA stage asks for more only with room. `fail` errors with `OverflowError`. `conflate` merges them into one.\n```ts\ncode();\n```\n| a | b |\n- A list item that is long enough.\nToo short.';
    assert.deepEqual(sentencesOf(text), [
      'A stage asks for more only with room.',
      '`fail` errors with `OverflowError`.',
      '`conflate` merges them into one.',
      'a; b',
      'A list item that is long enough.',
    ]);
  });

  it('quotes a code line as a code span and a table row with its header, in reading order', () => {
    const text = [
      'Install it first:',
      '```sh',
      '# comment',
      'npm install rxjs',
      '}',
      '```',
      '| Scheduler | Runs work |',
      '| --- | :---: |',
      '| asapScheduler | on the microtask queue |',
      '| asyncScheduler | with setTimeout |',
      'Then the prose goes on for a while.',
    ].join('\n');
    assert.deepEqual(sentencesOf(text), [
      '`npm install rxjs`',
      'Scheduler: asapScheduler; Runs work: on the microtask queue',
      'Scheduler: asyncScheduler; Runs work: with setTimeout',
      'Then the prose goes on for a while.',
    ]);
  });

  it('ranks sentences by the words they share with the question as well as by cosine, dropping those under half the best', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: 'Install with npm first.\n```\nnpm install rxjs\n```', source: 'a.md › Install', headings: 'Guide › Install', score: 1 },
    ];
    const candidates = candidatesOf(passages);
    assert.deepEqual(
      candidates.map((c) => c.text),
      ['Install with npm first.', '`npm install rxjs`'],
    );
    const question = v(1, 0);
    // By cosine alone the prose wins; the code line holds the rare word the question asks for.
    const vectors = [v(0.9, 0.44), v(0.6, 0.8)];
    const weights: Record<string, number> = { install: 1, rxjs: 3 };
    const words = { terms: ['install', 'rxjs'], weight: (t: string) => weights[t] ?? 0, termsOf: (t: string) => t.toLowerCase().match(/[a-z]+/g) ?? [] };
    assert.match(composeAnswer(question, passages, candidates, vectors, { sentences: 1 }).text, /^Install with npm first\. \[1\]/);
    assert.match(composeAnswer(question, passages, candidates, vectors, { sentences: 1 }, words).text, /^`npm install rxjs` \[1\]/);
  });

  it('leaves out link reference definitions and never ends a sentence at e.g., i.e. or inside a code span', () => {
    const text =
      'Pass a level name (e.g. `info`) or its number, i.e. 30 for info.\n\n[the full documentation of every option]: https://example.com/docs\n[1]: https://example.com';
    assert.deepEqual(sentencesOf(text), ['Pass a level name (e.g. `info`) or its number, i.e. 30 for info.']);
    assert.deepEqual(sentencesOf('- `nak(millis?: number)` - like ack, but the message is sent again. Then `term()` ends it.'), [
      '`nak(millis?: number)` - like ack, but the message is sent again.',
      'Then `term()` ends it.',
    ]);
  });

  it('quotes a sentence once, and a lone code line only when it holds more than the prose around it', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: '```js\nimport { Server } from "ws";\n```\nCompression is disabled by default on the server.', source: 'a.md › Server', score: 1 },
      { id: 'b', text: 'Compression is disabled by default on the server.', source: 'b.md › Server', score: 0.9 },
    ];
    const candidates = candidatesOf(passages);
    const weights: Record<string, number> = { server: 1, compression: 3, default: 1 };
    const words = {
      terms: ['server', 'compression', 'default'],
      weight: (t: string) => weights[t] ?? 0,
      termsOf: (t: string) => t.toLowerCase().match(/[a-z]+/g) ?? [],
    };
    // The import line is as close by cosine and shares "server": weighed down, it falls under half the best.
    const answer = composeAnswer(v(1, 0), passages, candidates, [v(0.8, 0.6), v(0.8, 0.6), v(0.8, 0.6)], { sentences: 3 }, words);
    assert.equal(answer.text.split('\n\n')[0], 'Compression is disabled by default on the server. [1]');
  });

  it('picks the closest sentences above the threshold, writes them in reading order with their source numbers, then the sources', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: 'First one here now. Second one here now.', source: 'a.md › A', score: 0.9 },
      { id: 'b', text: 'Third one here now.', source: 'b.md › B', score: 0.8 },
    ];
    const candidates = candidatesOf(passages);
    assert.deepEqual(
      candidates.map((c) => [c.passage, c.position]),
      [
        [0, 0],
        [0, 1],
        [1, 0],
      ],
    );
    const question = v(1, 0);
    // Third closest, then second; first below the threshold.
    const answer = composeAnswer(question, passages, candidates, [v(0, 1), v(0.6, 0.8), v(1, 0.1)], { sentences: 3, minScore: 0.5 });
    assert.equal(answer.text, 'Second one here now. [1] Third one here now. [2]\n\nSources:\n[1] a.md › A\n[2] b.md › B');
    assert.deepEqual(
      answer.sources.map((s) => s.id),
      ['a', 'b'],
    );
    assert.deepEqual(composeAnswer(question, passages, candidates, [v(0, 1), v(0, 1), v(0, 1)]), { text: NO_ANSWER, sources: [] });
    assert.deepEqual(composeAnswer(question, [], [], []), { text: NO_ANSWER, sources: [] });
  });

  it('streams an answer as words with their following space, losing nothing', () => {
    const text = 'One two [1]\n\nSources:\n[1] a.md';
    assert.equal(answerPieces(text).join(''), text);
    assert.deepEqual(answerPieces('a b'), ['a ', 'b']);
  });

  it('cosinesTo gives cosineSimilarity of the question with each vector, to the last bit (property)', () => {
    const vector = (dim: number) => fc.float32Array({ minLength: dim, maxLength: dim, noDefaultInfinity: true, noNaN: true, min: -4, max: 4 });
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 24 }).chain((dim) => fc.tuple(vector(dim), fc.array(vector(dim), { maxLength: 6 }))),
        ([question, vectors]) => {
          const cosines = cosinesTo(question, vectors);
          assert.equal(cosines.length, vectors.length);
          vectors.forEach((v, i) => assert.ok(Object.is(cosines[i], cosineSimilarity(question, v)), `${cosines[i]} ≠ ${cosineSimilarity(question, v)}`));
          assert.deepEqual(cosinesTo(question, vectors, Math.min(1, vectors.length)), cosines.slice(0, 1));
        },
      ),
      { numRuns: 300 },
    );
  });
});
