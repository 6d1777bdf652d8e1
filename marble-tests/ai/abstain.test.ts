import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { answerLogOdds, settledByCoverage, supportsAnswer, type Evidence } from '../../src/ai/rag/abstain.js';
import { LexicalIndex, lexicalTerms } from '../../src/ai/rag/lexical-index.js';
import { retrievePassages } from '../../src/ai/rag/retriever.js';
import { VectorIndex } from '../../src/ai/rag/vector-index.js';
import type { PassageMetadata } from '../../src/ai/rag/passage.js';

describe('supportsAnswer: the fitted decision', () => {
  it('decides a table of cases: coverage settles the ends, the BM25 share against the question length the rest', () => {
    const cases: readonly [Evidence, boolean, string][] = [
      [{ lexical: 0.9, bm25: 0.5, terms: 6 }, true, 'most of the question in one passage, however weak its BM25 score'],
      [{ lexical: 0.5, bm25: 0.5, terms: 2 }, true, 'half of a short question'],
      [{ lexical: 0.3, bm25: 0, terms: 4 }, false, 'no query word held anywhere'],
      [{ lexical: 0, bm25: 0, terms: 0 }, false, 'a question of stop words only'],
      [{ lexical: 0.3, bm25: 20, terms: 6 }, true, 'part of the question, scored far above its IDF mass'],
      [{ lexical: 0.3, bm25: 2, terms: 6 }, false, 'part of the question, scored about its IDF mass'],
      [{ lexical: 0.3, bm25: 5, terms: 6 }, true, 'the same share suffices for a six-term question…'],
      [{ lexical: 0.3, bm25: 5, terms: 3 }, false, '…and not for a three-term one, which BM25 multiplies less'],
      [{ lexical: 0.3, bm25: 1, terms: 4, dense: 9 }, false, 'with a lexical index, the embedding does not outvote the words'],
      [{ dense: 3 }, true, 'without a lexical index, the dense signal decides'],
      [{ dense: 0.5 }, false, 'without a lexical index, a dense score that does not stand out abstains'],
      [{}, false, 'no evidence at all'],
    ];
    for (const [evidence, answered, why] of cases) assert.equal(supportsAnswer(evidence), answered, `${JSON.stringify(evidence)}: ${why}`);
  });

  it('leniency shifts the fitted odds, not what coverage settles; dense sets the bar without a lexical index', () => {
    const borderline: Evidence = { lexical: 0.3, bm25: 2, terms: 6 };
    assert.equal(supportsAnswer(borderline), false);
    assert.equal(supportsAnswer(borderline, { leniency: 2 }), true);
    assert.equal(supportsAnswer({ lexical: 0.9, bm25: 0.5, terms: 6 }, { leniency: -100 }), true, 'most of the question is there');
    assert.equal(supportsAnswer({ lexical: 0.3, bm25: 0, terms: 4 }, { leniency: 100 }), false, 'no word held');
    assert.equal(supportsAnswer({ dense: 0.8 }, { dense: 0.7 }), true);
  });

  const evidence = fc.record({
    lexical: fc.double({ min: 0, max: 1, noNaN: true }),
    bm25: fc.double({ min: 0, max: 100, noNaN: true }),
    terms: fc.integer({ min: 0, max: 40 }),
  });

  it('never abstains on stronger evidence: more BM25 share, more coverage, more leniency', () => {
    fc.assert(
      fc.property(evidence, fc.double({ min: 0, max: 50, noNaN: true }), fc.double({ min: 0, max: 1, noNaN: true }), (e, more, coverage) => {
        if (!supportsAnswer(e)) return;
        assert.equal(supportsAnswer({ ...e, bm25: e.bm25 + more }), true, 'a higher BM25 share');
        assert.equal(supportsAnswer({ ...e, lexical: Math.max(e.lexical, coverage) }), true, 'more of the question held');
        assert.equal(supportsAnswer(e, { leniency: more }), true, 'more leniency');
      }),
    );
  });

  it('a question longer than the fit saw counts as one of eight terms, and the odds rise with the BM25 share', () => {
    fc.assert(
      fc.property(evidence, fc.integer({ min: 8, max: 100 }), (e, terms) => {
        assert.equal(answerLogOdds({ ...e, terms }), answerLogOdds({ ...e, terms: 8 }));
        const doubled = answerLogOdds({ ...e, bm25: e.bm25 * 2 })!;
        // Shares too small to tell from none count alike.
        assert.ok(e.bm25 >= 0.01 ? doubled > answerLogOdds(e)! : doubled >= answerLogOdds(e)!);
        const settled = settledByCoverage(e);
        if (settled !== undefined) assert.equal(supportsAnswer(e, { leniency: 1000 }), settled);
      }),
    );
  });
});

describe('retrievePassages: the evidence abstention weighs', () => {
  const passages = [
    { id: 'a#1', text: 'A full queue rejects new requests with status 429 until a slot frees.', source: 'queue.md', headings: 'Queue › Overflow' },
    { id: 'a#2', text: 'Workers take jobs from the queue in the order they arrived.', source: 'queue.md', headings: 'Queue › Order' },
    { id: 'b#1', text: 'Set the log level with the LOG_LEVEL environment variable.', source: 'logging.md', headings: 'Logging' },
    { id: 'b#2', text: 'Log lines are JSON objects, one a line, written to standard output.', source: 'logging.md', headings: 'Logging › Format' },
  ];
  const axes: Record<string, number[]> = { 'a#1': [1, 0, 0], 'a#2': [0.8, 0.2, 0], 'b#1': [0, 1, 0], 'b#2': [0, 0.8, 0.2] };
  const dense = new VectorIndex<PassageMetadata>(3);
  for (const p of passages) dense.add(p.id, axes[p.id]!, { text: p.text, source: p.source, headings: p.headings });
  const lexical = LexicalIndex.of(dense.entries());
  const plan = { index: dense, lexical, mode: 'hybrid' as const, k: 2 };

  it('bm25 is the best BM25 score over the question IDF mass, terms its distinct indexed terms', () => {
    const question = 'What status does a full queue answer with?';
    const { evidence } = retrievePassages(plan, question, [1, 0, 0]);
    const terms = lexicalTerms(question);
    const mass = terms.reduce((sum, t) => sum + lexical.idf(t), 0);
    assert.equal(evidence.terms, terms.length);
    assert.ok(Math.abs(evidence.bm25! - lexical.search(question, 1)[0]!.score / mass) < 1e-12);
    assert.equal(supportsAnswer(evidence), true, JSON.stringify(evidence));
  });

  it('a question the documents do not cover is abstained; one with no indexed word has no BM25 share', () => {
    const offTopic = retrievePassages(plan, 'Who painted the Mona Lisa in Florence?', [0, 0, 1]).evidence;
    assert.equal(offTopic.bm25, 0);
    assert.equal(supportsAnswer(offTopic), false);
    const empty = retrievePassages(plan, 'what is it?', [0, 0, 1]).evidence;
    assert.deepEqual([empty.terms, empty.bm25], [0, 0]);
    assert.equal(supportsAnswer(empty), false);
  });

  it('dense-only retrieval still weighs the BM25 share, searching the words once', () => {
    const { evidence } = retrievePassages({ ...plan, mode: 'dense' }, 'How do I set the log level?', [0, 1, 0]);
    assert.ok(evidence.bm25! > 0);
    assert.equal(supportsAnswer(evidence), true, JSON.stringify(evidence));
  });
});
