/** BM25 beside the dense index, its IDF coverage, and fusing rankings by rank or by score. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { LexicalIndex, lexicalTerm, lexicalTerms } from '../../src/ai/rag/lexical-index.js';
import { reciprocalRankFusion, scoreFusion } from '../../src/ai/rag/fusion.js';
import { supportsAnswer } from '../../src/ai/rag/abstain.js';
import type { PassageMetadata } from '../../src/ai/rag/passage.js';
import { lastValueFrom, toArray } from 'rxjs';
import { VectorIndex } from '../../src/ai/rag/vector-index.js';
import { retrievePassages } from '../../src/ai/rag/retriever.js';
import { SECTION_WINDOW_CHARS } from '../../src/ai/rag/section-index.js';
import { feedbackTerms } from '../../src/ai/rag/query-expansion.js';
import { namesIn } from '../../src/ai/rag/names.js';
import { retrieve } from '../../src/ai/stages/retrieve.js';
import { fromIterable } from '../../src/flow/sources.js';
import { untraced } from '../../src/index.js';
import { InvalidOptionsError } from '../../src/core/errors.js';

const passages = [
  { id: 'p#1', text: '`shed-oldest` evicts the oldest buffered element.', source: 'policies.md › Shedding', headings: 'Overflow policies › Shedding' },
  { id: 'p#2', text: 'A policy says what happens when the buffer is full.', source: 'policies.md › The vocabulary', headings: 'Overflow policies' },
  { id: 'b#1', text: 'Run `npm install rxjs` before anything else.', source: 'setup.md › Install', headings: 'Setup › Install' },
  { id: 'b#2', text: 'The buffer of a stage is bounded.', source: 'setup.md › Buffers', headings: 'Setup › Buffers' },
];

describe('LexicalIndex', () => {
  const index = LexicalIndex.of(passages);

  it('finds a passage by a rare word or a code name, and by its heading path', () => {
    assert.equal(index.search('which policy evicts the oldest element?', 2)[0]!.id, 'p#1');
    assert.equal(index.search('npm install rxjs', 1)[0]!.id, 'b#1');
    assert.equal(index.search('setup', 1)[0]!.metadata.source.split(' › ')[0], 'setup.md');
    assert.deepEqual(index.search('boiling water', 3), []);
    const named = LexicalIndex.of<PassageMetadata>([...passages, { id: 'c#1', text: 'Add fields to every line.', source: 'guides/child-loggers.md' }]);
    assert.equal(named.search('child logger', 1)[0]!.id, 'c#1', 'by the words of its file name');
  });

  it('compounds: two words of a question the corpus writes as one are found as one, and retrieval ranks by them', () => {
    const docs = LexicalIndex.of<PassageMetadata>([
      { id: 'cli#1', text: 'Set the size of the libuv threadpool with UV_THREADPOOL_SIZE.', source: 'cli.md › Environment' },
      { id: 'w#1', text: 'A worker thread runs JavaScript in parallel with the main thread.', source: 'workers.md › Threads' },
      { id: 'p#1', text: 'A connection pool keeps sockets open.', source: 'net.md › Pools' },
      { id: 'f#1', text: 'Each filename is resolved against the current directory.', source: 'fs.md › Paths' },
    ]);
    assert.deepEqual(docs.compounds('How big is the thread pool of libuv by default?'), ['threadpool']);
    assert.deepEqual(docs.compounds('Which file names are resolved, and is a to do list?'), ['filenam']);
    assert.deepEqual(docs.compounds('boiling water pool'), []);
    const vectors = new VectorIndex<PassageMetadata>(2);
    const found = retrievePassages({ index: vectors, lexical: docs, k: 1, mode: 'lexical' }, 'how big is the thread pool', undefined);
    assert.equal(found.passages[0]?.id, 'cli#1', 'the passage that writes it as one word');
  });

  it('terms: case, plurals, -ed, -ing and stop words folded the same for queries and passages', () => {
    assert.deepEqual(lexicalTerms('What are the policies?'), lexicalTerms('policy'));
    assert.equal(lexicalTerm('paused'), lexicalTerm('pause'));
    assert.equal(lexicalTerm('shedding'), lexicalTerm('shed'));
    const adverbs = { quietly: 'quiet', explicitly: 'explicit', exactly: 'exact', directly: 'direct', recursively: 'recursive' };
    for (const [adverb, word] of Object.entries(adverbs)) assert.equal(lexicalTerm(adverb), lexicalTerm(word), adverb);
    assert.notEqual(lexicalTerm('deli'), lexicalTerm('de'), 'a short word ending in -li keeps it');
    assert.equal(lexicalTerm('the'), null);
    assert.equal(lexicalTerm('available'), null, 'a word that frames a question ("what X are available"), not its subject');
    // A quantifier says how many, not what about: "several" must not meet "severity" (both stem to `sever`).
    assert.deepEqual(lexicalTerms('several targets, every request, a few various levels'), lexicalTerms('targets request levels'));
    assert.notEqual(lexicalTerm('severity'), null);
    assert.deepEqual(lexicalTerms('shedOldest 429'), [lexicalTerm('shedOldest'), 'shed', 'oldest', '429']);
    assert.deepEqual(lexicalTerms('<div align="center"><img src="logo.png"></div> Logo <!-- note -->'), ['logo'], 'HTML tags and comments are no words');
  });

  it('terms: C++, C# and F# are languages, I/O and A/B abbreviations, not lone letters; HTTP/2 is also http2', () => {
    assert.deepEqual(lexicalTerms('non-blocking I/O'), lexicalTerms('non blocking io'));
    assert.deepEqual(lexicalTerms('A/B tests'), lexicalTerms('ab tests'));
    assert.deepEqual(lexicalTerms('a/b/c x/yz'), lexicalTerms('yz'), 'a path or a ratio of words, as before');
    assert.deepEqual(lexicalTerms('the C++ standard'), lexicalTerms('c++ standard'));
    assert.notDeepEqual(lexicalTerms('the C++ standard'), lexicalTerms('the C standard'));
    assert.notDeepEqual(lexicalTerms('C# records'), lexicalTerms('F# records'));
    assert.deepEqual(lexicalTerms('g++ -O2'), [lexicalTerm('gplusplus'), 'o2']);
    assert.deepEqual(lexicalTerms('an HTTP/2 server'), ['http2', 'http', '2', lexicalTerm('server')], 'a protocol and its version: also as code names it');
    assert.deepEqual(lexicalTerms('HTTP/1.1'), ['http1', 'http', '1']);
    assert.deepEqual(lexicalTerms('10/20 TCP/IP'), ['10', '20', 'tcp', 'ip']);
    assert.deepEqual(lexicalTerms('c#d i++; a+b'), [], 'inside code, letters as before');
  });

  it('coverage: the share of the query’s IDF mass a passage holds, rare words weighing more', () => {
    assert.equal(index.coverage('evicts oldest', 'p#1'), 1);
    assert.equal(index.coverage('capital of Australia', 'p#1'), 0);
    assert.equal(index.coverage('the of what', 'p#1'), 0, 'no word that says something');
    // "buffer" is in three passages, "evicts" in one: holding only the common word covers less.
    const common = index.coverage('buffer evicts', 'b#2');
    const rare = index.coverage('buffer evicts', 'p#1');
    assert.ok(common > 0 && common < 0.5 && rare === 1, `${common} ${rare}`);
  });

  it('specificity: the IDF mass of the query words a passage holds over ln n, so rare words held together single it out', () => {
    const rare = index.specificity('evicts oldest', 'p#1');
    const common = index.specificity('buffer evicts', 'b#2');
    const ln = Math.log(index.size);
    assert.ok(Math.abs(rare - (index.idf('evict') + index.idf('oldest')) / ln) < 1e-12, `${rare}`);
    assert.ok(rare > common && common > 0, `${rare} ${common}`);
    assert.equal(index.specificity('capital of Australia', 'p#1'), 0);
    assert.equal(LexicalIndex.of([passages[0]!]).specificity('evicts oldest', passages[0]!.id), 0, 'one passage singles out nothing');
  });

  it('removing a passage forgets its words and their frequencies', () => {
    const copy = LexicalIndex.of(passages);
    const before = copy.idf(lexicalTerm('buffer')!);
    assert.equal(copy.remove('b#2'), true);
    assert.equal(copy.remove('b#2'), false);
    assert.ok(copy.idf(lexicalTerm('buffer')!) > before);
    assert.ok(copy.search('bounded', 3).every((hit) => hit.id !== 'b#2'));
  });

  it('counts a word of the headings or file name three times one of the text: a heading names the subject', () => {
    const mirrored = LexicalIndex.of<PassageMetadata>([
      { id: 'h#1', text: 'Pools', source: 'a.md', headings: 'Retries' },
      { id: 't#1', text: 'Retries', source: 'b.md', headings: 'Pools' },
    ]);
    const [heading, text] = mirrored.search('retries', 2);
    assert.equal(heading!.id, 'h#1');
    assert.ok(Math.abs(heading!.score / text!.score - 3) < 1e-9, `ratio ${heading!.score / text!.score}`);
  });

  it('weight: a word everyday English uses often weighs less than a name as rare in the corpus', () => {
    const rare = LexicalIndex.of<PassageMetadata>(
      Array.from({ length: 200 }, (_, i) => ({
        id: `w#${i}`,
        text: i === 0 ? 'Keep going: comments are fine in JSON5.' : `Filler passage ${i} about nothing.`,
        source: `w${i}.md`,
      })),
    );
    const [going, json5] = [lexicalTerm('going')!, lexicalTerm('json5')!];
    assert.equal(rare.idf(going), rare.idf(json5), 'one passage holds each');
    assert.ok(rare.weight(json5) >= rare.idf(json5), 'a name English does not use weighs as rare as the corpus says, or more');
    assert.ok(rare.weight(going) < rare.idf(going), `${rare.weight(going)} against ${rare.idf(going)}`);
    // Missing an everyday word of the question costs less than missing its subject.
    assert.ok(rare.coverage('going json5', 'w#1') < rare.coverage('going json5', 'w#0'));
    assert.ok(rare.coverage('json5 postgresql', 'w#0') <= 0.5, 'a name missing weighs at least as much as the one held');
  });

  it('weight: in a small corpus, an everyday word it lacks does not outweigh the words of its subject', () => {
    const small = LexicalIndex.of<PassageMetadata>(
      Array.from({ length: 12 }, (_, i) => ({
        id: `s#${i}`,
        text: i < 4 ? `A sluice stage applies backpressure to its producer, part ${i}.` : `Buffers and policies, part ${i}, shed or pause.`,
        source: `s${i}.md`,
      })),
    );
    const [handle, sluice] = [lexicalTerm('handle')!, lexicalTerm('sluice')!];
    assert.equal(small.idf(handle) > small.idf(sluice), true, 'by the corpus alone, the word it lacks is the rarest');
    assert.ok(small.weight(handle) - small.weight(sluice) < small.idf(handle) - small.idf(sluice), 'beside English at large, much less so');
    assert.ok(small.coverage('How does sluice handle backpressure?', 's#0') >= 0.5, String(small.coverage('How does sluice handle backpressure?', 's#0')));
  });

  it('documentCoverage: the largest share of the query one file holds across its passages, kept when passages go', () => {
    const docs = LexicalIndex.of<PassageMetadata>([
      { id: 'a#1', text: 'The retry budget is five attempts.', source: 'retry.md › Budget' },
      { id: 'a#2', text: 'Backoff doubles between attempts.', source: 'retry.md › Backoff' },
      { id: 'b#1', text: 'Backoff is a word used elsewhere.', source: 'other.md' },
    ]);
    const query = lexicalTerms('retry budget backoff');
    assert.ok(docs.coverage(query, 'a#1') < 1 && docs.coverage(query, 'a#2') < 1);
    assert.equal(docs.documentCoverage(query), 1, 'retry.md holds every word, in two passages');
    assert.ok(docs.documentShares(query).get('other.md')! < 1);
    assert.equal(docs.documentCoverage(lexicalTerms('boiling water')), 0);
    docs.remove('a#2');
    assert.ok(docs.documentCoverage(query) < 1, 'the passage holding "backoff" is gone from retry.md');
    docs.remove('a#1');
    assert.equal(docs.documentShares(query).has('retry.md'), false);
  });

  it('terms: a camel-case run counts whole and as its parts, so a name like OpenAI is a term of its own', () => {
    assert.deepEqual(lexicalTerms('OpenAI'), [lexicalTerm('openai'), lexicalTerm('open'), lexicalTerm('ai')]);
    const names = LexicalIndex.of<PassageMetadata>([
      { id: 'o#1', text: 'The OpenAI client retries twice.', source: 'openai.md' },
      { id: 'v#1', text: 'Open an issue; the AI SDK retries too.', source: 'ai.md' },
    ]);
    assert.equal(names.search('openai retries', 1)[0]!.id, 'o#1');
  });

  it('keeps a lone digit as a term (a version, a count), a lone letter not', () => {
    assert.equal(lexicalTerm('4'), '4');
    assert.equal(lexicalTerm('a'), null);
    const versions = LexicalIndex.of<PassageMetadata>(
      [
        { text: 'fast-check 3 runs on Node 12.', source: 'v3.md' },
        { text: 'fast-check 4 runs on Node 18.', source: 'v4.md' },
      ].map((p, i) => ({ id: `v#${i + 3}`, ...p })),
    );
    assert.equal(versions.search('which Node does fast-check 4 run on?', 1)[0]!.id, 'v#4');
  });
});

describe('LexicalIndex by sections', () => {
  // The question's words are spread over one section's paragraphs; another file's single paragraph holds as many as either.
  const spread: (PassageMetadata & { id: string })[] = [
    { id: 'a#1', text: 'The client reconnects when the socket closes.', source: 'a.md › Reconnect', headings: 'Client › Reconnect' },
    { id: 'a#2', text: 'Each wait doubles, capped at thirty seconds.', source: 'a.md › Reconnect', headings: 'Client › Reconnect' },
    { id: 'b#1', text: 'A socket wait longer than the timeout closes the request.', source: 'b.md › Timeouts', headings: 'Server › Timeouts' },
    { id: 'b#2', text: 'Requests are logged.', source: 'b.md › Logging', headings: 'Server › Logging' },
  ];
  const query = 'does the wait between socket reconnects double?';

  it('ranks the section that holds the words together, standing for its best-covered passages', () => {
    const index = LexicalIndex.of(spread);
    const hits = index.searchSections(query, 3);
    assert.deepEqual(
      hits
        .slice(0, 2)
        .map((h) => h.id)
        .sort(),
      ['a#1', 'a#2'],
    );
    assert.equal(hits[2]!.id, 'b#1');
    assert.deepEqual(
      index.searchSections(query, 3, (m) => m.source.startsWith('b.md')).map((h) => h.id),
      ['b#1'],
      'the filter applies',
    );
    const section = retrievePassages(
      { index: new VectorIndex<PassageMetadata>(2), lexical: index, mode: 'lexical', k: 1, granularity: 'section' },
      query,
      undefined,
    );
    assert.equal(section.passages[0]!.source, 'a.md › Reconnect');
  });

  it('stays in step as passages are removed, and bounds a section to windows of whole passages', () => {
    const index = LexicalIndex.of(spread);
    index.remove('a#2');
    assert.ok(index.searchSections('doubles', 3).every((h) => h.id !== 'a#2'));
    assert.deepEqual(index.searchSections('doubles', 3), [], 'no section holds the word any more');
    const long = 'x'.repeat(SECTION_WINDOW_CHARS);
    const windows = LexicalIndex.of<PassageMetadata>([
      { id: 'l#1', text: `alpha ${long}`, source: 'l.md › Long', headings: 'Long' },
      { id: 'l#2', text: `omega ${long}`, source: 'l.md › Long', headings: 'Long' },
    ]);
    assert.deepEqual(
      windows
        .searchSections('alpha omega', 3)
        .map((h) => h.id)
        .sort(),
      ['l#1', 'l#2'],
      'two windows, each found by its own word',
    );
    assert.equal(windows.searchSections('alpha', 3).length, 1, 'the second passage is not in the first window');
  });
});

describe('pseudo-relevance feedback', () => {
  const corpus: (PassageMetadata & { id: string })[] = [
    { id: 'r#1', text: 'Hide a password with redact paths.', source: 'redaction.md › Paths' },
    { id: 'r#2', text: 'Redact paths accept wildcards.', source: 'redaction.md › Wildcards' },
    { id: 'z#1', text: 'Log levels are numbers.', source: 'levels.md' },
    { id: 'z#2', text: 'Transports write log lines elsewhere.', source: 'transports.md' },
    { id: 'z#3', text: 'Child loggers add fields to log lines.', source: 'child.md' },
  ];
  const index = LexicalIndex.of(corpus);

  it('draws the words the first passages share, weighed by rarity, the strongest at the given weight', () => {
    const terms = feedbackTerms(lexicalTerms('hide password'), [{ text: corpus[0]!.text, score: 2 }], index, { terms: 2, weight: 0.5 });
    assert.equal(terms.length, 2);
    assert.equal(terms[0]!.weight, 0.5);
    assert.ok(
      terms.every((t) => t.term !== lexicalTerm('hide') && t.term !== lexicalTerm('password')),
      'never a word already asked',
    );
    assert.ok(terms.every((t) => t.weight <= 0.5 && t.weight > 0));
    assert.deepEqual(feedbackTerms(['x'], [], index, { terms: 2, weight: 0.5 }), [], 'nothing found, nothing added');
  });

  it('finds a passage in the corpus’s own words that shares none of the question’s', () => {
    const plan = { index: new VectorIndex<PassageMetadata>(2), lexical: index, mode: 'lexical' as const, k: 3 };
    const plain = retrievePassages(plan, 'hide password', undefined).passages.map((p) => p.id);
    assert.deepEqual(plain, ['r#1']);
    const fed = retrievePassages({ ...plan, feedback: { passages: 1, terms: 3, weight: 0.5 } }, 'hide password', undefined).passages.map((p) => p.id);
    assert.deepEqual(fed.slice(0, 2), ['r#1', 'r#2'], 'the asker’s words still lead');
  });
});

describe('reciprocalRankFusion', () => {
  it('ranks what both lists hold high above what one holds first', () => {
    const fused = reciprocalRankFusion([
      ['a', 'b', 'c'],
      ['d', 'b', 'a'],
    ]);
    assert.deepEqual(
      fused.map((f) => f.id),
      ['a', 'b', 'd', 'c'],
    );
    assert.deepEqual(fused[0]!.ranks, [0, 2]);
  });

  it('weights scale a ranking’s votes', () => {
    const rankings = [
      ['a', 'b'],
      ['b', 'a'],
    ];
    assert.deepEqual(
      reciprocalRankFusion(rankings, 60, [0.5, 1]).map((f) => f.id),
      ['b', 'a'],
    );
    assert.deepEqual(
      reciprocalRankFusion(rankings, 60, [1, 0.5]).map((f) => f.id),
      ['a', 'b'],
    );
  });

  it('is one list unchanged when fused alone, and every id appears once', () => {
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.string({ minLength: 1, maxLength: 3 }), { maxLength: 20 }),
        fc.uniqueArray(fc.string({ minLength: 1, maxLength: 3 }), { maxLength: 20 }),
        (a, b) => {
          assert.deepEqual(
            reciprocalRankFusion([a]).map((f) => f.id),
            a,
          );
          const fused = reciprocalRankFusion([a, b]).map((f) => f.id);
          assert.deepEqual([...fused].sort(), [...new Set([...a, ...b])].sort());
        },
      ),
    );
  });
});

describe('scoreFusion', () => {
  const ranking = (...entries: [string, number][]) => entries.map(([id, score]) => ({ id, score }));

  it("keeps one ranking's clear winner first where rank fusion lets passages both rank fairly pass it", () => {
    // BM25 finds `fact` far ahead of the rest; the dense ranking does not hold it within its depth.
    const lexical = ranking(['fact', 12], ['b', 4], ['c', 3.9], ['d', 3.8], ['e', 3.7]);
    const dense = ranking(['b', 0.61], ['c', 0.6], ['d', 0.6], ['e', 0.59], ['x', 0.58]);
    const byScore = scoreFusion([dense, lexical], [0.5, 1]).map((f) => f.id);
    assert.equal(byScore[0], 'fact');
    const byRank = reciprocalRankFusion([dense.map((h) => h.id), lexical.map((h) => h.id)], 60, [0.5, 1]).map((f) => f.id);
    assert.ok(byRank.indexOf('fact') > 2, `rank fusion puts it at ${byRank.indexOf('fact')}`);
  });

  it('weights scale a ranking’s scores; an entry a ranking lacks counts its lowest score', () => {
    const a = ranking(['x', 1], ['y', 0.5]);
    const b = ranking(['y', 10], ['x', 8]);
    assert.deepEqual(
      scoreFusion([a, b], [1, 0.2]).map((f) => f.id),
      ['x', 'y'],
    );
    assert.deepEqual(
      scoreFusion([a, b], [0.2, 1]).map((f) => f.id),
      ['y', 'x'],
    );
    const fused = scoreFusion([ranking(['p', 2], ['q', 1]), ranking(['r', 4])]);
    assert.equal(fused.find((f) => f.id === 'q')!.score, 0.5 + 1, 'q: half the best of its own, and the lowest of the ranking without it');
    assert.deepEqual(fused.find((f) => f.id === 'r')!.ranks, [undefined, 0]);
  });

  it('an entry a complete ranking lacks counts 0: one BM25 hit is not the floor of every other passage', () => {
    const dense = ranking(['pause', 0.5], ['timing', 0.47], ['memory', 0.18]);
    const lexical = ranking(['memory', 15.5]);
    // Truncated, the lexical ranking's lowest score is its only one: every passage it lacks would tie its hit.
    assert.equal(scoreFusion([dense, lexical], [0.5, 1])[0]!.id, 'pause');
    assert.deepEqual(
      scoreFusion([dense, lexical], [0.5, 1], [false, true]).map((f) => f.id),
      ['memory', 'pause', 'timing'],
    );
    assert.equal(scoreFusion([dense, lexical], [0.5, 1], [false, true]).find((f) => f.id === 'pause')!.score, 0.5);
  });

  it('is one list unchanged when fused alone, holds every id once, and ignores the scale of each ranking', () => {
    const scored = fc.uniqueArray(fc.record({ id: fc.string({ minLength: 1, maxLength: 3 }), score: fc.double({ min: 0.01, max: 100, noNaN: true }) }), {
      selector: (e) => e.id,
      maxLength: 20,
    });
    fc.assert(
      fc.property(scored, scored, fc.double({ min: 0.01, max: 1000, noNaN: true }), (a, b, scale) => {
        const sortedA = [...a].sort((x, y) => y.score - x.score);
        const sortedB = [...b].sort((x, y) => y.score - x.score);
        const alone = scoreFusion([sortedA]).map((f) => f.score);
        assert.ok(
          alone.every((s, i) => i === 0 || s <= alone[i - 1]!),
          'one ranking keeps its order of scores',
        );
        const fused = scoreFusion([sortedA, sortedB]);
        assert.deepEqual(fused.map((f) => f.id).sort(), [...new Set([...a, ...b].map((e) => e.id))].sort());
        const rescaled = scoreFusion([sortedA, sortedB.map((e) => ({ id: e.id, score: e.score * scale }))]);
        rescaled.forEach((f, i) => assert.ok(Math.abs(f.score - fused[i]!.score) < 1e-9));
      }),
    );
  });
});

describe('supportsAnswer', () => {
  it('answers on most of the query’s words, or on part of them with a dense score far above the background', () => {
    assert.equal(supportsAnswer({ lexical: 0.9 }), true);
    assert.equal(supportsAnswer({ lexical: 0.4, dense: 0.8 }), false);
    assert.equal(supportsAnswer({ lexical: 0.3, dense: 4 }), false, 'too little of the question, whatever the embedding says');
    assert.equal(supportsAnswer({ lexical: 0.4, dense: 4 }), true);
    assert.equal(supportsAnswer({ lexical: 0, dense: 9 }), false, 'an embedding alone never outvotes no shared word');
    assert.equal(supportsAnswer({ dense: 3 }), true, 'without a lexical index, the dense signal decides');
    assert.equal(supportsAnswer({}), false);
  });

  it('answers on part of the query’s words when the passage’s page holds the rest', () => {
    assert.equal(supportsAnswer({ lexical: 0.4, document: 0.7 }), true);
    assert.equal(supportsAnswer({ lexical: 0.4, document: 0.5 }), false, 'the page lacks half of what was asked');
    assert.equal(supportsAnswer({ lexical: 0.2, document: 1 }), false, 'a page holding every word, but no passage of it much');
    assert.equal(supportsAnswer({ lexical: 0.2, document: 1 }, { passageCoverage: 0.2 }), true);
  });

  it('answers on a third of the query’s words when the words held are rare enough together to single the passage out', () => {
    assert.equal(supportsAnswer({ lexical: 0.32, specificity: 1.6 }), true);
    assert.equal(supportsAnswer({ lexical: 0.32, specificity: 1.2 }), false, 'words about as common as one passage in n');
    assert.equal(supportsAnswer({ lexical: 0.2, specificity: 4 }), false, 'too little of the question, however rare the rest');
    assert.equal(supportsAnswer({ lexical: 0.32, specificity: 1.2 }, { specificity: 1 }), true);
  });
});

describe('supportsAnswer with word meanings', () => {
  it('answers on a fifth of the query’s words when a passage means what the question asks, never on the meaning alone', () => {
    assert.equal(supportsAnswer({ lexical: 0.25, meaning: 0.65 }), true);
    assert.equal(supportsAnswer({ lexical: 0.25, meaning: 0.5 }), false, 'a meaning as close as an off-topic question’s');
    assert.equal(supportsAnswer({ lexical: 0.1, meaning: 0.9 }), false, 'word vectors alone never outvote no shared word');
    assert.equal(supportsAnswer({ lexical: 0.25, meaning: 0.65, unknownName: 'Kubernetes' }), false, 'a name the corpus never mentions');
    assert.equal(supportsAnswer({ lexical: 0.25, meaning: 0.5 }, { meaning: 0.45 }), true);
  });
});

describe('names a question uses, and whether the corpus mentions them', () => {
  it('finds words written as names: two capitals or more, or a capital in mid sentence; none in a shouted text', () => {
    assert.deepEqual(namesIn('PDF text extraction'), ['PDF']);
    assert.deepEqual(namesIn('What port does a PostgreSQL server use? Then ask in Kubernetes, or OK.'), ['PostgreSQL', 'Kubernetes']);
    assert.deepEqual(namesIn('Can I use Node.js, Wi-Fi and C++ with useLayoutEffect and Node.js?'), ['Node.js', 'Wi-Fi', 'C++', 'useLayoutEffect']);
    assert.deepEqual(namesIn('How do I install it? Where is the log?'), [], 'a capital opening a sentence names nothing');
    assert.deepEqual(namesIn('HOW DO I INSTALL IT WITH NPM?'), []);
    assert.deepEqual(
      namesIn('How do I debounce fs.watch() or logger.child, e.g. in package.json or cmd.exe?'),
      ['fs.watch', 'logger.child'],
      'a member in code is a name; an abbreviation or a file name is not',
    );
    assert.equal(namesIn(Array.from({ length: 100 }, (_, i) => `Name${i}`).join(' and ')).length, 32, 'a long text is looked up for 32 names at most');
    assert.deepEqual(
      namesIn('Why does Cargo fail on git = "git@github.com:me/MyLib.git" and https://Example.com/Docs, or ./src/Main.rs in GitHub and TCP/IP'),
      ['Cargo', 'GitHub', 'TCP', 'IP'],
      "a URL, an address or a path is the asker's own value: no name in it is looked up",
    );
  });

  it('a corpus mentions a name as a word, as the start of a longer one, joined (coffee-script) or by all its parts', () => {
    const index = LexicalIndex.of([
      { id: 'a#1', text: 'Register coffee-script first, then connect to PostgreSQL.', source: 'a.md' },
      { id: 'a#2', text: 'Send the Content header with a type.', source: 'a.md' },
    ]);
    for (const known of ['PostgreSQL', 'Postgres', 'CoffeeScript', 'Content-Type', 'Register']) assert.equal(index.mentions(known), true, known);
    for (const unknown of ['Kubernetes', 'PDF', 'Pantone', 'Wi-Fi']) assert.equal(index.mentions(unknown), false, unknown);
    // A member in code is mentioned as itself, never by its parts (`register` and `connect` are words here).
    const code = LexicalIndex.of([{ id: 'c#1', text: 'Call `db.connect()` first; `register` a hook to connect.', source: 'c.md' }]);
    assert.equal(code.mentions('db.connect'), true);
    assert.equal(code.mentions('db.register'), false);
    index.remove('a#1');
    assert.equal(index.mentions('CoffeeScript'), false, 'a removed passage mentions nothing');
    assert.equal(index.mentions('Postgres'), false, 'nor does it start a longer word any more');
    index.add('b#1', { id: 'b#1', text: 'PostgreSQLAdapter connects.', source: 'b.md' });
    assert.equal(index.mentions('Postgres'), true);
  });

  it('retrieval names the first name no passage mentions, and the answer abstains on it unless names is false', () => {
    const index = LexicalIndex.of([{ id: 'p#1', text: 'The server listens on port 8080 by default.', source: 'server.md' }]);
    const plan = { index: new VectorIndex<PassageMetadata>(2), lexical: index, mode: 'lexical' as const, k: 3 };
    plan.index.add('p#1', [1, 0], { text: 'The server listens on port 8080 by default.', source: 'server.md' });
    const covered = retrievePassages(plan, 'Which port does the server listen on by default?', undefined).evidence;
    assert.equal(covered.unknownName, undefined);
    assert.equal(supportsAnswer(covered), true);
    const other = retrievePassages(plan, 'Which port does a PostgreSQL server listen on by default?', undefined).evidence;
    assert.equal(other.unknownName, 'PostgreSQL');
    assert.equal(supportsAnswer(other), false);
    // However much of the question a passage holds.
    assert.equal(supportsAnswer({ lexical: 0.9, unknownName: 'PostgreSQL' }), false);
    assert.equal(supportsAnswer({ lexical: 0.9, unknownName: 'PostgreSQL' }, { names: false }), true);
  });
});

describe('retrieve: hybrid fusion weighs the dense ranking by denseWeight', () => {
  // Dense says b#2 first (its vector is the query's); BM25 says p#1 first (the query's rare words).
  const dense = new VectorIndex<PassageMetadata>(2);
  const axis: Record<string, [number, number]> = { 'p#1': [0.2, 1], 'p#2': [0, 1], 'b#1': [0.3, 1], 'b#2': [1, 0] };
  for (const p of passages) dense.add(p.id, axis[p.id]!, { text: p.text, source: p.source });
  const first = async (denseWeight?: number) => {
    const [out] = await lastValueFrom(
      fromIterable([{ vector: [1, 0], text: 'which policy evicts the oldest element' }]).pipe(
        retrieve({ index: dense, lexical: LexicalIndex.of(passages), k: 2, ...(denseWeight !== undefined && { denseWeight }) }),
        untraced(),
        toArray(),
      ),
    );
    return out!.passages[0]!.id;
  };

  it('a query only one passage holds a word of keeps that passage first, however the dense ranking orders the rest', () => {
    // Only b#1 holds `rxjs`: the lexical search finds one passage, so the others score 0 there, not its best.
    const found = retrievePassages({ index: dense, lexical: LexicalIndex.of(passages), mode: 'hybrid', k: 3 }, 'rxjs', [1, 0]);
    assert.equal(found.passages[0]!.id, 'b#1');
    assert.equal(found.evidence.lexical, 1);
  });

  it('by default BM25 leads (the generated embedder hashes words); weighed enough, the dense ranking leads instead', async () => {
    assert.equal(await first(), 'p#1');
    // p#1 is in both rankings: the dense first overtakes it only past a weight of about 31.
    assert.equal(await first(40), 'b#2');
    assert.throws(
      () => retrieve({ index: dense, lexical: LexicalIndex.of(passages), k: 2, denseWeight: 0 }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'denseWeight',
    );
  });

  it('checks granularity, feedback and abstain up front, naming the bad field', () => {
    assert.throws(
      () => retrieve({ index: dense, lexical: LexicalIndex.of(passages), k: 2, granularity: 'chapter' as 'section' }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'granularity',
    );
    assert.throws(
      () => retrieve({ index: dense, lexical: LexicalIndex.of(passages), k: 2, feedback: { passages: 0, terms: 5, weight: 0.3 } }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'feedback.passages',
    );
    // A field of the abstain thresholds is named, not just the boolean-or-thresholds option it sits in.
    assert.throws(
      () => retrieve({ index: dense, lexical: LexicalIndex.of(passages), k: 2, abstain: { names: 'yes' as unknown as boolean } }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'abstain.names',
    );
  });
});
