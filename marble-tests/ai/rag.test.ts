import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import * as z from 'zod';
import { lastValueFrom, toArray, type Observable } from 'rxjs';
import { embed, type Embedder } from '../../src/ai/stages/embed.js';
import { retrieve, withCitations } from '../../src/ai/stages/retrieve.js';
import { PromptTemplate, assemble } from '../../src/ai/stages/assemble.js';
import { fromIterable } from '../../src/flow/sources.js';
import { hashingEmbedder } from '../support/hashing-embedder.js';
import { StageStats } from '../../src/flow/stats.js';
import { InvalidOptionsError, StageError } from '../../src/core/errors.js';
import { VectorIndex } from '../../src/ai/rag/vector-index.js';
import { EmbeddingCache } from '../../src/ai/rag/embedding-cache.js';
import { chunkMarkdown, indexPassages, loadCorpus } from '../../src/ai/rag/corpus.js';
import { countTokens, tokenize } from '../../src/ai/rag/tokens.js';
import type { PassageMetadata, RetrievedPassage } from '../../src/ai/rag/passage.js';
import {
  DuplicateIdError,
  EmbedderOutputError,
  EmptyPromptError,
  IndexFormatError,
  InvalidVectorError,
  PromptOverBudgetError,
  TemplateVariablesError,
} from '../../src/ai/rag/errors.js';

const collect = <T>(flow: Observable<T>): Promise<T[]> => lastValueFrom(flow.pipe(toArray()));

/** The typed error a stage reports: as it is, or as the cause of a StageError when the work threw synchronously. */
function unwrap(error: unknown): unknown {
  return error instanceof StageError ? error.cause : error;
}

function errorOf(run: () => unknown): unknown {
  try {
    run();
  } catch (error) {
    return error;
  }
  assert.fail('expected an error');
}

/** The reference answer: every score, fully sorted (score desc, id asc), filtered, cut to k. */
function naiveTopK<M>(index: VectorIndex<M>, query: number[], k: number, minScore: number, keep: (id: string) => boolean) {
  return index
    .scoreAll(query)
    .filter((h) => h.score >= minScore && keep(h.id))
    .sort((a, b) => b.score - a.score || (a.id < b.id ? -1 : 1))
    .slice(0, k);
}

describe('VectorIndex: exact top-k', () => {
  const vectorArb = (dim: number) => fc.array(fc.integer({ min: -4, max: 4 }), { minLength: dim, maxLength: dim }).filter((v) => v.some((x) => x !== 0));

  it('returns the same hits as a full sort of every score, ties broken by id', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 13 }).chain((dim) =>
          fc.record({
            dim: fc.constant(dim),
            // A small pool of distinct vectors reused across ids makes exact ties common.
            pool: fc.array(vectorArb(dim), { minLength: 1, maxLength: 6 }),
            picks: fc.array(fc.nat(), { minLength: 0, maxLength: 60 }),
            query: vectorArb(dim),
            k: fc.integer({ min: 1, max: 12 }),
            minScore: fc.option(fc.double({ min: -1, max: 1, noNaN: true }), { nil: undefined }),
            filtered: fc.boolean(),
          }),
        ),
        ({ dim, pool, picks, query, k, minScore, filtered }) => {
          const index = new VectorIndex<{ even: boolean }>(dim, { capacity: 1 });
          picks.forEach((p, i) => index.add(`id-${(i * 7919) % 1000}-${i}`, pool[p % pool.length]!, { even: i % 2 === 0 }));
          const filter = filtered ? (m: { even: boolean }) => m.even : undefined;
          const hits = index.search(query, { k, ...(minScore === undefined ? {} : { minScore }), ...(filter ? { filter } : {}) });
          const expected = naiveTopK(index, query, k, minScore ?? -Infinity, (id) => !filter || filter(index.get(id)!));
          assert.deepEqual(
            hits.map((h) => [h.id, h.score]),
            expected.map((h) => [h.id, h.score]),
          );
        },
      ),
      { numRuns: 300 },
    );
  });

  it('scores are cosine similarities (checked in float64)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 40 }).chain((dim) => fc.tuple(fc.array(vectorArb(dim), { minLength: 1, maxLength: 10 }), vectorArb(dim))),
        ([rows, query]) => {
          const index = new VectorIndex<null>(query.length);
          rows.forEach((row, i) => index.add(`r${i}`, row, null));
          const norm = (v: number[]) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
          for (const { id, score } of index.scoreAll(query)) {
            const row = rows[Number(id.slice(1))]!;
            const cosine = row.reduce((s, x, j) => s + x * query[j]!, 0) / (norm(row) * norm(query));
            assert.ok(Math.abs(score - cosine) < 1e-5, `${id}: ${score} vs ${cosine}`);
          }
        },
      ),
      { numRuns: 200 },
    );
  });

  it('after removes and re-adds, answers exactly like an index built from the remaining rows', () => {
    fc.assert(
      fc.property(
        fc.array(vectorArb(5), { minLength: 1, maxLength: 40 }),
        fc.array(fc.boolean(), { minLength: 40, maxLength: 40 }),
        vectorArb(5),
        ([...rows], removed, query) => {
          const index = new VectorIndex<number>(5, { capacity: 2 });
          rows.forEach((row, i) => index.add(`r${i}`, row, i));
          rows.forEach((_, i) => removed[i] && assert.equal(index.remove(`r${i}`), true));
          assert.equal(index.remove('absent'), false);
          const kept = rows.map((row, i) => [i, row] as const).filter(([i]) => !removed[i]);
          assert.equal(index.size, kept.length);
          const fresh = new VectorIndex<number>(5);
          for (const [i, row] of [...kept].reverse()) fresh.add(`r${i}`, row, i);
          assert.deepEqual(index.search(query, { k: 7 }), fresh.search(query, { k: 7 }));
          for (const [i] of kept) assert.equal(index.get(`r${i}`), i);
          // A removed id can be added again.
          if (removed[0]) index.add('r0', rows[0]!, 0);
          assert.equal(index.has('r0'), true);
        },
      ),
      { numRuns: 150 },
    );
  });

  it('rejects bad input with typed errors naming the field', () => {
    const index = new VectorIndex<null>(3);
    index.add('a', [1, 0, 0], null);
    const wrongDim = errorOf(() => index.search([1, 0], { k: 1 }));
    assert.ok(wrongDim instanceof InvalidVectorError, 'wrongDim instanceof InvalidVectorError');
    assert.equal(wrongDim.field, 'query');
    assert.match(wrongDim.message, /2 components, expected dim 3/);
    const nan = errorOf(() => index.add('b', [1, Number.NaN, 0], null));
    assert.ok(nan instanceof InvalidVectorError, 'nan instanceof InvalidVectorError');
    assert.equal(nan.field, 'vector');
    assert.match(nan.message, /component 1 is NaN/);
    assert.equal(index.has('b'), false);
    assert.ok(
      errorOf(() => index.add('c', [0, 0, 0], null)) instanceof InvalidVectorError,
      "errorOf(() => index.add('c', [0, 0, 0], null)) instanceof InvalidVectorError",
    );
    for (const k of [0, -1, 1.5]) {
      const error = errorOf(() => index.search([1, 0, 0], { k }));
      assert.ok(error instanceof InvalidOptionsError, 'error instanceof InvalidOptionsError');
      assert.deepEqual(
        error.issues.map((i) => i.path),
        ['k'],
      );
    }
    assert.ok(
      errorOf(() => index.add('a', [0, 1, 0], null)) instanceof DuplicateIdError,
      "errorOf(() => index.add('a', [0, 1, 0], null)) instanceof DuplicateIdError",
    );
    const badDim = errorOf(() => new VectorIndex(0));
    assert.ok(badDim instanceof InvalidOptionsError, 'badDim instanceof InvalidOptionsError');
    assert.equal(badDim.issues[0]!.path, 'dim');
  });
});

describe('VectorIndex: save and load', () => {
  let dir = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sluice-rag-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  async function saved(): Promise<{ path: string; index: VectorIndex<PassageMetadata>; bytes: Buffer }> {
    const index = new VectorIndex<PassageMetadata>(6);
    for (let i = 0; i < 20; i++) index.add(`p${i}`, [i, 1, -i, 2, i % 3, 1], { text: `passage ${i}`, source: `doc${i % 4}.md` });
    index.remove('p3');
    const path = join(dir, `index-${Math.random().toString(36).slice(2)}.slvi`);
    await index.save(path);
    return { path, index, bytes: await readFile(path) };
  }

  it('round-trips rows, ids and metadata: the loaded index answers identically', async () => {
    const { path, index } = await saved();
    const loaded = await VectorIndex.load(path, { schema: z.object({ text: z.string(), source: z.string() }) });
    assert.equal(loaded.dim, 6);
    assert.equal(loaded.size, 19);
    for (const query of [
      [1, 0, 0, 0, 0, 0],
      [3, -1, 2, 0, 1, 1],
    ])
      assert.deepEqual(loaded.search(query, { k: 19 }), index.search(query, { k: 19 }));
    assert.deepEqual(loaded.get('p19'), { text: 'passage 19', source: 'doc3.md' });
  });

  it('names the corrupt part of a damaged file', async () => {
    const { path, bytes } = await saved();
    const corrupt = async (mutate: (b: Buffer) => Buffer, field: string | RegExp) => {
      const target = `${path}.bad`;
      await writeFile(target, mutate(Buffer.from(bytes)));
      await assert.rejects(VectorIndex.load(target), (error: unknown) => {
        assert.ok(error instanceof IndexFormatError, String(error));
        assert.equal(error.code, 'INDEX_FORMAT');
        if (typeof field === 'string') assert.equal(error.field, field);
        else assert.match(error.field, field);
        return true;
      });
    };
    await corrupt((b) => b.subarray(0, 10), 'length');
    await corrupt((b) => (b.write('NOPE', 0), b), 'magic');
    await corrupt((b) => (b.writeUInt32LE(99, 4), b), 'version');
    await corrupt((b) => (b.writeUInt32LE(0, 8), b), 'dim');
    await corrupt((b) => (b.writeUInt32LE(20, 12), b), 'length');
    await corrupt((b) => b.subarray(0, b.length - 1), 'length');
    await corrupt((b) => (b.writeFloatLE(7.5, 20 + 4 * 6 * 5), b), 'vectors');
    await corrupt((b) => (b.writeFloatLE(Number.NaN, 20), b), 'vectors');
    await corrupt((b) => (b.write('#', b.length - 3), b), 'metadata');
    await corrupt((b) => Buffer.from(b.toString('latin1').replace('"p1"', '"p2"'), 'latin1'), 'metadata');
    const wrongShape = `${path}.shape`;
    await writeFile(wrongShape, bytes);
    await assert.rejects(VectorIndex.load(wrongShape, { schema: z.object({ text: z.number() }) }), (error: unknown) => {
      assert.ok(error instanceof IndexFormatError, 'error instanceof IndexFormatError');
      assert.equal(error.field, 'metadata[0]');
      return true;
    });
  });
});

describe('embed', () => {
  it('serves repeated texts from the LRU cache, noting hit or miss in each trace and counting them', async () => {
    const embedder = hashingEmbedder();
    const cache = new EmbeddingCache(10);
    const stats = new StageStats();
    const out = await collect(fromIterable(['alpha', 'beta', 'alpha', 'alpha']).pipe(embed({ embedder, cache, stats })));
    assert.deepEqual(
      out.map((t) => t.trace.notes?.['embed.cache']),
      ['miss', 'miss', 'hit', 'hit'],
    );
    assert.deepEqual(embedder.calls, [['alpha'], ['beta']]);
    assert.equal(out[2]!.value.vector, out[0]!.value.vector);
    assert.deepEqual([cache.hits, cache.misses, cache.size], [2, 2, 2]);
    assert.deepEqual([stats.received, stats.delivered], [4, 4]);
  });

  it('evicts the least recently used text', async () => {
    const embedder = hashingEmbedder();
    const cache = new EmbeddingCache(2);
    await collect(fromIterable(['a', 'b', 'a', 'c', 'b', 'a']).pipe(embed({ embedder, cache })));
    // c evicts b (a was used after b); b then evicts a.
    assert.deepEqual(embedder.calls.flat(), ['a', 'b', 'c', 'b', 'a']);
    assert.deepEqual([cache.hits, cache.misses, cache.evictions], [1, 5, 3]);
  });

  it('embeds a selected field and passes the input through', async () => {
    const out = await collect(
      fromIterable([{ q: 'what is a policy', user: 7 }]).pipe(
        embed({ embedder: hashingEmbedder(16), text: (v: { q: string; user: number }) => v.q, cache: { capacity: 4 } }),
      ),
    );
    assert.equal(out[0]!.value.input.user, 7);
    assert.equal(out[0]!.value.text, 'what is a policy');
    assert.equal(out[0]!.value.vector.length, 16);
  });

  it('fails the stream with a typed error when the embedder output is malformed', async () => {
    const bad: Embedder = async () => [new Float32Array([1, Number.NaN])];
    await assert.rejects(collect(fromIterable(['x']).pipe(embed({ embedder: bad }))), (error: unknown) => {
      assert.ok(error instanceof EmbedderOutputError, 'error instanceof EmbedderOutputError');
      assert.equal(error.stage, 'embed');
      assert.match(error.message, /component 1 is NaN/);
      return true;
    });
    const none: Embedder = async () => [];
    await assert.rejects(collect(fromIterable(['x']).pipe(embed({ embedder: none }))), EmbedderOutputError);
    await assert.rejects(
      collect(fromIterable([42 as unknown as string]).pipe(embed({ embedder: hashingEmbedder() }))),
      (error: unknown) => error instanceof StageError && error.cause instanceof TypeError && /pass a `text` selector/.test(error.cause.message),
    );
  });

  it('validates its options, naming each bad field', () => {
    const error = errorOf(() => embed({ embedder: 'nope' as unknown as Embedder, cache: { capacity: 0 } }));
    assert.ok(error instanceof InvalidOptionsError, 'error instanceof InvalidOptionsError');
    assert.deepEqual(error.issues.map((i) => i.path).sort(), ['cache.capacity', 'embedder']);
    const stageOption = errorOf(() => embed({ embedder: hashingEmbedder(), capacity: 0 }));
    assert.ok(stageOption instanceof InvalidOptionsError, 'stageOption instanceof InvalidOptionsError');
    assert.equal(stageOption.issues[0]!.path, 'capacity');
  });
});

describe('retrieve and citations', () => {
  const index = new VectorIndex<PassageMetadata & { lang: string }>(3);
  index.add('x', [1, 0, 0], { text: 'about x', source: 'x.md', lang: 'en' });
  index.add('xy', [1, 1, 0], { text: 'about x and y', source: 'xy.md', lang: 'fr' });
  index.add('y', [0, 1, 0], { text: 'about y', source: 'y.md', lang: 'en' });
  index.add('z', [0, 0, 1], { text: 'about z', source: 'x.md', lang: 'en' });

  it('returns the k best passages, best first, honouring minScore and filter', async () => {
    const run = (options: { k: number; minScore?: number; filter?: (m: PassageMetadata & { lang: string }) => boolean }) =>
      collect(fromIterable([{ vector: new Float32Array([1, 0.2, 0]) }]).pipe(retrieve({ index, ...options })));
    const [top2] = await run({ k: 2 });
    assert.deepEqual(
      top2!.value.passages.map((p) => p.id),
      ['x', 'xy'],
    );
    assert.deepEqual(Object.keys(top2!.value.passages[0]!).sort(), ['id', 'score', 'source', 'text']);
    assert.ok(top2!.value.passages[0]!.score > top2!.value.passages[1]!.score, 'top2!.value.passages[0]!.score > top2!.value.passages[1]!.score');
    assert.equal(top2!.trace.notes?.['retrieve.hits'], 2);
    const [above] = await run({ k: 4, minScore: 0.5 });
    assert.deepEqual(
      above!.value.passages.map((p) => p.id),
      ['x', 'xy'],
    );
    const [french] = await run({ k: 4, filter: (m) => m.lang === 'en' });
    assert.deepEqual(
      french!.value.passages.map((p) => p.id),
      ['x', 'y', 'z'],
    );
  });

  it('reads the query through a selector, and validates its options', async () => {
    const [out] = await collect(fromIterable([[0, 0, 2]]).pipe(retrieve({ index, k: 1, query: (v: number[]) => v })));
    assert.deepEqual(
      out!.value.passages.map((p) => p.text),
      ['about z'],
    );
    const error = errorOf(() => retrieve({ index, k: 0, minScore: 2 }));
    assert.ok(error instanceof InvalidOptionsError, 'error instanceof InvalidOptionsError');
    assert.deepEqual(error.issues.map((i) => i.path).sort(), ['k', 'minScore']);
  });

  it('formats passages with [n] markers, one per source, and a sources list', () => {
    const cited = withCitations([
      { id: 'a', text: 'First.', source: 'one.md › Intro' },
      { id: 'b', text: ' Second. ', source: 'two.md' },
      { id: 'c', text: 'Third.', source: 'one.md › Intro' },
    ]);
    assert.equal(cited.text, '[1] First.\n\n[2] Second.\n\n[1] Third.\n\nSources:\n[1] one.md › Intro\n[2] two.md');
    assert.deepEqual(cited.citations, [
      { marker: 1, source: 'one.md › Intro', ids: ['a', 'c'] },
      { marker: 2, source: 'two.md', ids: ['b'] },
    ]);
    assert.deepEqual(withCitations([]), { text: '', citations: [] });
  });
});

describe('prompt assembly', () => {
  const schema = z.object({ question: z.string() });
  const passage = (id: string, score: number, words: number): RetrievedPassage => ({
    id,
    score,
    text: Array.from({ length: words }, (_, i) => `${id}w${i}`).join(' '),
    source: `${id}.md`,
  });
  const template = (budget: number, extra: Partial<ConstructorParameters<typeof PromptTemplate>[0]> = {}) =>
    new PromptTemplate({ template: 'Context:\n{{context}}\nQ: {{question}}', schema, budget, ...extra });
  const total = (messages: readonly { content: string }[]) => messages.reduce((s, m) => s + countTokens(m.content), 0);

  it('drops the lowest-scored passages first and reports them, lowest first', () => {
    const passages = [passage('mid', 0.5, 10), passage('low', 0.1, 10), passage('high', 0.9, 10), passage('lower', 0.2, 10)];
    const full = template(10_000).render({ question: 'why?' }, passages);
    assert.deepEqual(full.dropped, []);
    const perPassage = countTokens(`[1] ${passages[0]!.text}`) + countTokens('[1] mid.md');
    const prompt = template(full.tokens - 2 * perPassage).render({ question: 'why?' }, passages);
    assert.deepEqual(prompt.dropped, ['low', 'lower']);
    assert.deepEqual(
      prompt.citations.map((c) => c.ids[0]),
      ['high', 'mid'],
    );
    assert.ok(prompt.tokens <= full.tokens - 2 * perPassage, 'prompt.tokens <= full.tokens - 2 * perPassage');
    assert.equal(prompt.tokens, total(prompt.messages));
  });

  it('never exceeds the budget, keeps the best passages and never cuts inside a token (property)', () => {
    const word = fc.stringMatching(/^[a-z]{1,8}[.,!?]?$/);
    fc.assert(
      fc.property(
        fc.array(fc.record({ words: fc.array(word, { minLength: 1, maxLength: 30 }), score: fc.double({ min: -1, max: 1, noNaN: true }) }), { maxLength: 8 }),
        fc.integer({ min: 1, max: 250 }),
        fc.boolean(),
        (raw, budget, truncate) => {
          const passages = raw.map((p, i) => ({ id: `p${i}`, score: p.score, text: p.words.join(' '), source: `s${i % 3}.md` }));
          const prompt = template(budget, { system: 'Be brief.', truncate });
          let result;
          try {
            result = prompt.render({ question: 'what now?' }, passages);
          } catch (error) {
            assert.ok(error instanceof PromptOverBudgetError, 'error instanceof PromptOverBudgetError');
            assert.ok(error.over > 0, 'error.over > 0');
            return;
          }
          assert.ok(result.tokens <= budget, 'result.tokens <= budget');
          assert.equal(result.tokens, total(result.messages));
          const dropped = new Set(result.dropped);
          const kept = passages.filter((p) => !dropped.has(p.id) && p.id !== result.truncated);
          for (const k of kept) for (const d of passages.filter((p) => dropped.has(p.id))) assert.ok(k.score >= d.score, `kept ${k.id} over better ${d.id}`);
          const user = result.messages.at(-1)!.content;
          for (const k of kept) assert.ok(user.includes(k.text), `${k.id} kept whole`);
          if (result.truncated !== undefined) {
            assert.equal(kept.length, 0);
            const original = passages.find((p) => p.id === result.truncated)!;
            const line = user.split('\n').find((l) => l.startsWith('[1] '))!;
            const cut = tokenize(line.slice(4));
            assert.ok(cut.length > 0 && cut.length < tokenize(original.text).length, 'cut.length > 0 && cut.length < tokenize(original.text).length');
            assert.deepEqual(cut, tokenize(original.text).slice(0, cut.length));
          }
        },
      ),
      { numRuns: 400 },
    );
  });

  it('cuts the best passage at a token boundary when no whole passage fits', () => {
    const long = { id: 'long', score: 0.9, text: 'alpha beta-gamma delta, epsilon zeta eta theta iota kappa', source: 'l.md' };
    const bare = template(1000).render({ question: 'q' }, []).tokens;
    // 11 tokens of markers and sources list, then the first 4 tokens of the passage: "alpha beta - gamma".
    const prompt = template(bare + 15).render({ question: 'q' }, [long, passage('other', 0.1, 30)]);
    assert.equal(prompt.truncated, 'long');
    assert.deepEqual(prompt.dropped, ['other']);
    assert.ok(prompt.messages.at(-1)!.content.includes('[1] alpha beta-gamma\n\nSources:\n[1] l.md\n'), prompt.messages.at(-1)!.content);
    assert.equal(prompt.tokens, bare + 15);
    const untruncated = template(bare + 15, { truncate: false }).render({ question: 'q' }, [long]);
    assert.deepEqual([untruncated.truncated, untruncated.dropped], [undefined, ['long']]);
  });

  it('renders system prompt, few-shot examples and variables, without expanding slots inside values', () => {
    const prompt = new PromptTemplate({
      system: 'You answer questions about {{topic}}.',
      examples: [{ user: 'What is {{topic}}?', assistant: 'A library.' }],
      template: 'Q: {{question}} ({{count}})',
      schema: z.object({ topic: z.string(), question: z.string(), count: z.number() }),
      budget: 100,
    }).render({ topic: 'sluice', question: 'say {{topic}}', count: 3 });
    assert.deepEqual(prompt.messages, [
      { role: 'system', content: 'You answer questions about sluice.' },
      { role: 'user', content: 'What is {{topic}}?' },
      { role: 'assistant', content: 'A library.' },
      { role: 'user', content: 'Q: say {{topic}} (3)' },
    ]);
  });

  it('fails with typed errors: over budget by how much, empty prompt, bad variables, unknown template slots', () => {
    const over = errorOf(() => template(5, { system: 'one two three four five six' }).render({ question: 'q' }, [passage('a', 1, 3)]));
    assert.ok(over instanceof PromptOverBudgetError, 'over instanceof PromptOverBudgetError');
    assert.equal(over.code, 'PROMPT_OVER_BUDGET');
    const needed = countTokens('one two three four five six') + countTokens('Context:\n\nQ: q');
    assert.equal(over.over, needed - 5);
    assert.match(over.message, new RegExp(`${needed - 5} over the budget of 5`));

    const empty = errorOf(() => new PromptTemplate({ template: '{{question}}', schema, budget: 10 }).render({ question: '  ' }));
    assert.ok(empty instanceof EmptyPromptError, 'empty instanceof EmptyPromptError');
    assert.equal(empty.code, 'EMPTY_PROMPT');

    const missing = errorOf(() => template(100).render({} as { question: string }));
    assert.ok(missing instanceof TemplateVariablesError, 'missing instanceof TemplateVariablesError');
    assert.deepEqual(
      missing.issues.map((i) => i.path),
      ['question'],
    );
    const wrongType = errorOf(() => template(100).render({ question: 42 } as unknown as { question: string }));
    assert.ok(wrongType instanceof TemplateVariablesError, 'wrongType instanceof TemplateVariablesError');
    assert.deepEqual(
      wrongType.issues.map((i) => i.path),
      ['question'],
    );

    const unknown = errorOf(() => new PromptTemplate({ template: 'Q: {{questoin}}', system: '{{context}}', schema, budget: 10 }));
    assert.ok(unknown instanceof InvalidOptionsError, 'unknown instanceof InvalidOptionsError');
    assert.deepEqual(
      unknown.issues.map((i) => i.path),
      ['template', 'system'],
    );
    const badBudget = errorOf(() => template(0));
    assert.ok(badBudget instanceof InvalidOptionsError, 'badBudget instanceof InvalidOptionsError');
    assert.equal(badBudget.issues[0]!.path, 'budget');
  });

  it('as a stage: notes tokens and dropped ids in the trace, and fails the stream with PROMPT_OVER_BUDGET', async () => {
    const input = { question: 'why?', passages: [passage('a', 0.9, 5), passage('b', 0.1, 50)] };
    const [out] = await collect(
      fromIterable([input]).pipe(
        assemble({ template: '{{context}} Q: {{question}}', schema, budget: 30, variables: (v: typeof input) => ({ question: v.question }) }),
      ),
    );
    assert.deepEqual(out!.value.dropped, ['b']);
    assert.equal(out!.trace.notes?.['assemble.dropped'], 'b');
    assert.equal(out!.trace.notes?.['assemble.tokens'], out!.value.tokens);
    await assert.rejects(
      collect(fromIterable([{ question: 'why '.repeat(40) }]).pipe(assemble({ template: 'Q: {{question}}', schema, budget: 10 }))),
      (error: unknown) => {
        const typed = unwrap(error);
        return typed instanceof PromptOverBudgetError && typed.over === 32;
      },
    );
  });
});

describe('corpus and an end-to-end pipeline', () => {
  it('chunks markdown by heading and paragraph, keeping fenced code whole', () => {
    const passages = chunkMarkdown(
      'Intro line.\n\n# Title\n\nFirst para\ncontinues.\n\n```ts\nconst a = 1;\n\n# not a heading\n```\n\n## Sub\n- one\n- two\n',
      'doc.md',
    );
    assert.deepEqual(passages, [
      { id: 'doc.md#doc-md-1', text: 'Intro line.', source: 'doc.md' },
      { id: 'doc.md#title-1', text: 'First para\ncontinues.', source: 'doc.md › Title', headings: 'Title' },
      { id: 'doc.md#title-2', text: '```ts\nconst a = 1;\n\n# not a heading\n```', source: 'doc.md › Title', headings: 'Title' },
      { id: 'doc.md#sub-1', text: '- one\n- two', source: 'doc.md › Sub', headings: 'Title › Sub' },
    ]);
  });

  it('answers questions over the bundled corpus: embed → retrieve → assemble, with citations', async () => {
    const corpus = await loadCorpus();
    assert.equal(corpus.length, 18, 'one passage per paragraph of the five bundled documents');
    assert.equal(new Set(corpus.map((p) => p.id)).size, corpus.length);
    const embedder = hashingEmbedder(256);
    const index = await indexPassages(corpus, embedder, { batchSize: 8 });
    assert.equal(index.size, corpus.length);
    const questions = [
      'Which policy evicts the oldest buffered element?',
      'Why is a clock read sampled instead of timing every element?',
      'Which policy evicts the oldest buffered element?',
      'How does batch wait when downstream has no demand?',
    ];
    const cache = new EmbeddingCache(16);
    const prompts = await collect(
      fromIterable(questions).pipe(
        embed({ embedder, cache }),
        retrieve({ index, k: 4, minScore: 0.05 }),
        assemble({
          system: 'Answer from the context only. Cite sources as [n].',
          template: 'Context:\n{{context}}\n\nQuestion: {{question}}',
          schema: z.object({ question: z.string().min(1) }),
          variables: (r) => ({ question: r.input.text }),
          budget: 120,
        }),
      ),
    );
    assert.equal(prompts.length, 4);
    assert.deepEqual(
      prompts.map((p) => p.value.citations[0]?.source.split(' › ')[0]),
      ['policies.md', 'traces.md', 'policies.md', 'batching.md'],
    );
    for (const p of prompts) {
      assert.ok(p.value.tokens <= 120, `${p.value.tokens} tokens`);
      assert.match(p.value.messages.at(-1)!.content, /\[1\] [\s\S]*Sources:\n\[1\] /);
    }
    assert.equal(prompts[2]!.trace.notes?.['embed.cache'], 'hit');
    assert.equal(cache.hits, 1);
    assert.ok(
      prompts.some((p) => p.value.dropped.length > 0),
      'the budget of 120 tokens drops some passages',
    );
  });
});
