import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { answers, crossValidate, examplesOf, fitDecision, type Example } from '../../eval/fit-abstain.js';

/** Covered questions score high on the first feature, uncovered ones low; `overlap` of each crosses over. */
function examples(set: string, overlap: number): Example[] {
  const covered = Array.from({ length: 10 }, (_, i) => ({ set, covered: true, servedAbstained: false, features: [2 + i / 10, 5], settled: undefined }));
  const uncovered = Array.from({ length: 4 }, (_, i) => ({ set, covered: false, servedAbstained: true, features: [-1 - i / 10, 5], settled: undefined }));
  for (let i = 0; i < overlap; i++) covered[i] = { ...covered[i]!, features: [-2, 5] };
  return [...covered, ...uncovered];
}

describe('fit-abstain: the decision fitted across corpora', () => {
  it('separates covered from uncovered questions when a feature does, in its own units', () => {
    const decision = fitDecision([...examples('a', 0), ...examples('b', 0)], 8);
    assert.ok(decision.weights[0]! > 0, `weights ${decision.weights.join(', ')}`);
    for (const e of examples('c', 0)) assert.equal(answers(decision, e), e.covered);
  });

  it('weighs an uncovered question answered `cost` times a covered one abstained when choosing the threshold', () => {
    // A covered question below two uncovered ones: answering it answers them too.
    const mixed = [...examples('a', 0), { set: 'a', covered: true, servedAbstained: false, features: [-1.15, 5], settled: undefined }];
    const strict = fitDecision(mixed, 8);
    assert.equal(answers(strict, mixed.at(-1)!), false, 'one covered abstained costs less than two uncovered answered');
    assert.ok(mixed.filter((e) => !e.covered).every((e) => !answers(strict, e)));
    const lenient = fitDecision(mixed, 0.1);
    assert.equal(answers(lenient, mixed.at(-1)!), true, 'at a cost of 0.1 each, two uncovered answered cost less');
  });

  it('leaves each corpus out in turn and counts the decision fitted on the others', () => {
    const all = [...examples('a', 0), ...examples('b', 1), ...examples('c', 0)];
    const folds = crossValidate(all, 8);
    assert.deepEqual([...folds.keys()], ['a', 'b', 'c']);
    assert.deepEqual(folds.get('b'), { coveredAbstained: 1, covered: 10, uncoveredAbstained: 4, uncovered: 4 });
    assert.deepEqual(folds.get('a'), { coveredAbstained: 0, covered: 10, uncoveredAbstained: 4, uncovered: 4 });
  });

  it('reads the evidence of an eval report; coverage settles what it settles, and a report without evidence fails', () => {
    const report = {
      reports: [
        {
          name: 's',
          answers: [
            { question: { file: 'a.md' }, abstained: false, evidence: { lexical: 0.9, bm25: 3, terms: 4 } },
            { question: {}, abstained: true, evidence: { lexical: 0.1, bm25: 0, terms: 3 } },
            { question: {}, abstained: true, evidence: { lexical: 0.3, bm25: 2, terms: 5 } },
          ],
        },
      ],
    };
    const read = examplesOf(report);
    assert.deepEqual(
      read.map((e) => [e.covered, e.settled, e.features?.length]),
      [
        [true, true, undefined],
        [false, false, undefined],
        [false, undefined, 2],
      ],
    );
    assert.throws(() => examplesOf({ reports: [{ name: 's', answers: [{ question: {}, abstained: true }] }] }), /no evidence recorded/);
  });
});
