import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TestScheduler } from 'rxjs/testing';
import fc from 'fast-check';
import { lastValueFrom, map, toArray, type Observable, type OperatorFunction } from 'rxjs';
import { stage } from '../../operators/stage.js';
import { cached, type CachedAnswer } from '../../src/cache/cached.js';
import { fromIterable } from '../../src/flow/sources.js';
import type { Traced } from '../../src/core/trace.js';
import { InvalidOptionsError, StageError } from '../../src/core/errors.js';
import { CacheStats } from '../../src/cache/stats.js';
import { LruCache } from '../../src/cache/lru.js';
import { SemanticCache, normalize } from '../../src/cache/semantic.js';
import { SingleFlight } from '../../src/cache/flight.js';
import { cacheKey, canonicalJson, hashKey } from '../../src/cache/key.js';
import { ENTRY_OVERHEAD, estimateSize } from '../../src/cache/size.js';

const values = <T>(): OperatorFunction<Traced<T>, T> => map((t) => t.value);

function scheduler(): TestScheduler {
  return new TestScheduler((actual, expected) => assert.deepEqual(actual, expected));
}

/** Deterministic bag-of-words embedder: each word adds 1 to a hashed dimension (FNV-1a). */
function hashingEmbedder(dimensions = 256): { embed: (text: string, signal: AbortSignal) => Promise<Float32Array>; calls: () => number } {
  let calls = 0;
  return {
    calls: () => calls,
    embed: async (text) => {
      calls++;
      const vector = new Float32Array(dimensions);
      for (const word of text.toLowerCase().match(/[a-z0-9]+/g) ?? []) {
        let hash = 0x811c9dc5;
        for (let i = 0; i < word.length; i++) hash = Math.imul(hash ^ word.charCodeAt(i), 0x01000193) >>> 0;
        vector[hash % dimensions]! += 1;
      }
      return vector;
    },
  };
}

/** Collects every output of a pipeline, with its trace notes. */
async function run<T>(flow: Observable<Traced<T>>): Promise<{ value: T; notes: Record<string, string | number | boolean> | undefined }[]> {
  return lastValueFrom(
    flow.pipe(
      map((t) => ({ value: t.value, notes: t.trace.notes })),
      toArray(),
    ),
  );
}

describe('cache keys', () => {
  const base = { model: 'llama-3-8b', prompt: 'Hi', params: { temperature: 0, max_tokens: 64, stop: ['\n'] } };

  it('does not depend on the order of parameters or fields', () => {
    const reordered = { params: { stop: ['\n'], max_tokens: 64, temperature: 0 }, prompt: 'Hi', model: 'llama-3-8b' };
    assert.equal(cacheKey(base), cacheKey(reordered));
    assert.equal(canonicalJson({ b: { d: 1, c: 2 }, a: 0 }), '{"a":0,"b":{"c":2,"d":1}}');
    assert.match(cacheKey(base), /^[0-9a-f]{64}$/);
  });

  it('differs when the model, prompt, messages or any parameter differs', () => {
    const keys = [
      cacheKey(base),
      cacheKey({ ...base, model: 'llama-3-70b' }),
      cacheKey({ ...base, prompt: 'Hi!' }),
      cacheKey({ ...base, params: { ...base.params, temperature: 0.7 } }),
      cacheKey({ ...base, params: { ...base.params, stop: ['\n', '.'] } }),
      cacheKey({ model: base.model, messages: [{ role: 'user', content: 'Hi' }], params: base.params }),
    ];
    assert.equal(new Set(keys).size, keys.length);
  });

  it('leaves out fields that do not change the answer (a request id)', () => {
    assert.equal(cacheKey({ ...base, id: 'req-1' } as typeof base), cacheKey({ ...base, id: 'req-2' } as typeof base));
  });

  it('refuses values that cannot be keyed faithfully', () => {
    assert.throws(
      () => hashKey({ f: 1n }),
      (err: unknown) => (err as { code: string }).code === 'CACHE_KEY',
    );
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    assert.throws(
      () => hashKey(cyclic),
      (err: unknown) => (err as { code: string }).code === 'CACHE_KEY',
    );
  });
});

describe('LruCache', () => {
  const entry = (key: string, size: number) => ENTRY_OVERHEAD + key.length * 2 + size;

  it('evicts the least recently used entry, and reading makes an entry recent', () => {
    const stats = new CacheStats();
    const cache = new LruCache<number>({ maxBytes: entry('a', 100) * 3, sizeOf: (n) => n, stats });
    cache.set('a', 100);
    cache.set('b', 100);
    cache.set('c', 100);
    assert.equal(cache.get('a'), 100); // a is now the most recent: b goes first
    cache.set('d', 100);
    assert.deepEqual([...cache.keys()], ['c', 'a', 'd']);
    cache.set('e', 100);
    assert.deepEqual([...cache.keys()], ['a', 'd', 'e']);
    assert.equal(stats.evictions, 2);
    assert.deepEqual([stats.entries, stats.bytes], [3, entry('a', 100) * 3]);
  });

  it('expires entries after their time to live, in virtual time', () => {
    const ts = scheduler();
    const stats = new CacheStats();
    const seen: [number, string | undefined][] = [];
    ts.run(() => {
      const cache = new LruCache<string>({ maxBytes: 10_000, ttl: 10, scheduler: ts, stats });
      cache.set('k', 'v');
      ts.schedule(() => seen.push([ts.now(), cache.get('k')]), 9);
      ts.schedule(() => seen.push([ts.now(), cache.get('k')]), 10);
      ts.schedule(() => {
        cache.set('k', 'w'); // storing again restarts the time to live
        ts.schedule(() => seen.push([ts.now(), cache.get('k')]), 9);
      }, 12);
    });
    assert.deepEqual(seen, [
      [9, 'v'],
      [10, undefined],
      [21, 'w'],
    ]);
    assert.equal(stats.expirations, 1);
  });

  it('rejects an entry larger than maxBytes, counts it, and keeps what it holds', () => {
    const stats = new CacheStats();
    const cache = new LruCache<string>({ maxBytes: 400, stats });
    assert.equal(cache.set('small', 'x'), true);
    assert.equal(cache.set('big', 'x'.repeat(200)), false);
    assert.equal(cache.get('big'), undefined);
    assert.equal(cache.get('small'), 'x');
    assert.deepEqual([stats.rejected, stats.evictions, stats.entries], [1, 0, 1]);
  });

  it('never holds more than maxBytes and evicts exactly in LRU order (property, against a model)', () => {
    const op = fc.oneof(
      fc.record({ kind: fc.constant('set' as const), key: fc.integer({ min: 0, max: 12 }), size: fc.integer({ min: 0, max: 3000 }) }),
      fc.record({ kind: fc.constant('get' as const), key: fc.integer({ min: 0, max: 12 }), size: fc.constant(0) }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 4000 }), fc.array(op, { maxLength: 120 }), (maxBytes, ops) => {
        const stats = new CacheStats();
        const cache = new LruCache<number>({ maxBytes, sizeOf: (n) => n, stats });
        const model: { key: string; bytes: number; size: number }[] = [];
        let rejected = 0;
        for (const { kind, key: k, size } of ops) {
          const key = `k${k}`;
          const at = model.findIndex((e) => e.key === key);
          if (kind === 'get') {
            assert.equal(cache.get(key), at >= 0 ? model[at]!.size : undefined);
            if (at >= 0) model.push(...model.splice(at, 1));
          } else {
            if (at >= 0) model.splice(at, 1);
            const bytes = entry(key, size);
            assert.equal(cache.set(key, size), bytes <= maxBytes);
            if (bytes > maxBytes) rejected++;
            else model.push({ key, bytes, size });
            let total = model.reduce((s, e) => s + e.bytes, 0);
            while (total > maxBytes) total -= model.shift()!.bytes;
          }
          assert.ok(cache.bytes <= maxBytes, `holds ${cache.bytes} > ${maxBytes}`);
          assert.deepEqual(
            [...cache.keys()],
            model.map((e) => e.key),
          );
          assert.equal(
            cache.bytes,
            model.reduce((s, e) => s + e.bytes, 0),
          );
          assert.deepEqual([stats.bytes, stats.entries, stats.rejected], [cache.bytes, cache.size, rejected]);
        }
      }),
      { numRuns: 200 },
    );
  });

  it('estimates sizes as UTF-16 code units × 2 plus fixed overheads', () => {
    assert.equal(estimateSize('héllo'), 10);
    assert.equal(estimateSize(new Float32Array(4)), 16 + 16);
    assert.equal(estimateSize(['ab', 'c']), 16 + 8 + 4 + 8 + 2);
  });
});

describe('cached: response cache', () => {
  it('runs the work once for repeated requests and notes miss then hit', async () => {
    let calls = 0;
    const stats = new CacheStats();
    const work = cached((p: string) => (calls++, `answer to ${p}`), { response: { maxBytes: 100_000 }, stats });
    const out = await run(fromIterable(['a', 'b', 'a', 'a']).pipe(stage(work, { name: 'infer' })));
    assert.deepEqual(
      out.map((o) => o.value),
      ['answer to a', 'answer to b', 'answer to a', 'answer to a'],
    );
    assert.deepEqual(
      out.map((o) => o.notes?.['infer.cache']),
      ['miss', 'miss', 'hit', 'hit'],
    );
    assert.equal(calls, 2);
    assert.deepEqual([stats.hits, stats.misses, stats.entries, stats.requests], [2, 2, 2, 4]);
    assert.ok(stats.bytes > 0);
  });

  it('stores a completed token stream and replays the same tokens as a stream on a hit', () => {
    let calls = 0;
    scheduler().run(({ cold, expectObservable }) => {
      const work = cached(
        (_: string) => {
          calls++;
          return cold('-x-y-(z|)');
        },
        { response: { maxBytes: 100_000 } },
      );
      expectObservable(cold('p 9ms (p|)').pipe(stage(work), values())).toBe('-x-y-z 4ms (xyz|)');
    });
    assert.equal(calls, 1);
  });

  it('replays an AsyncIterable token stream identically', async () => {
    let calls = 0;
    async function* tokens(prompt: string) {
      calls++;
      for (const token of prompt.split(' ')) {
        await Promise.resolve();
        yield token;
      }
    }
    const work = cached(tokens, { response: { maxBytes: 100_000 } });
    const out = await run(fromIterable(['the quick fox', 'the quick fox']).pipe(stage(work, { name: 'gen' })));
    assert.deepEqual(
      out.map((o) => o.value),
      ['the', 'quick', 'fox', 'the', 'quick', 'fox'],
    );
    assert.deepEqual(
      out.map((o) => o.notes?.['gen.cache']),
      ['miss', 'miss', 'miss', 'hit', 'hit', 'hit'],
    );
    assert.equal(calls, 1);
  });

  it('never stores a stream that failed', () => {
    let calls = 0;
    const stats = new CacheStats();
    scheduler().run(({ cold, expectObservable }) => {
      const work = cached((_: string) => (++calls === 1 ? cold('-x#') : cold('-y|')), { response: { maxBytes: 100_000 }, stats });
      expectObservable(cold('p 9ms (p|)').pipe(stage(work, { errorPolicy: 'skip' }), values())).toBe('-x 8ms -y|');
    });
    assert.deepEqual([calls, stats.misses, stats.hits, stats.entries], [2, 2, 0, 1], 'the second, complete answer is the only one stored');
  });

  it('never stores a stream that was cancelled part way', () => {
    let calls = 0;
    const stats = new CacheStats();
    scheduler().run(({ cold, expectObservable }) => {
      const work = cached((_: string) => (calls++, cold('-x-y-(z|)')), { response: { maxBytes: 100_000 }, stats });
      expectObservable(cold('p|').pipe(stage(work), values()), '^--!').toBe('-x-');
      expectObservable(cold('10ms p|').pipe(stage(work), values())).toBe('10ms -x-y-(z|)');
    });
    assert.deepEqual([calls, stats.misses, stats.hits], [2, 2, 0]);
  });

  it('expires answers after their time to live, in virtual time', () => {
    let calls = 0;
    const stats = new CacheStats();
    const ts = scheduler();
    ts.run(({ cold, expectObservable }) => {
      const work = cached((p: string) => (calls++, p.toUpperCase()), { response: { maxBytes: 100_000, ttl: 10, scheduler: ts }, stats });
      expectObservable(cold('p 4ms p 9ms (p|)').pipe(stage(work), values())).toBe('P 4ms P 9ms (P|)');
    });
    assert.deepEqual([calls, stats.misses, stats.hits, stats.expirations], [2, 2, 1, 1]);
  });

  it('counts an answer too large for the cache as rejected and serves it anyway', async () => {
    const stats = new CacheStats();
    const work = cached((p: string) => p.repeat(1000), { response: { maxBytes: 1000 }, stats });
    const out = await run(fromIterable(['ab', 'ab']).pipe(stage(work)));
    assert.deepEqual(
      out.map((o) => o.value.length),
      [2000, 2000],
    );
    assert.deepEqual([stats.misses, stats.hits, stats.rejected, stats.entries, stats.bytes], [2, 0, 2, 0, 0]);
  });
});

describe('cached: semantic cache', () => {
  const france = 'What is the capital of France';
  const similar = 'what is the capital of france please';
  const other = 'Tell me a joke about cats';

  it('serves the answer of a similar prompt at or above the threshold, noting the similarity', async () => {
    const embedder = hashingEmbedder();
    const stats = new CacheStats();
    let calls = 0;
    const work = cached((p: string) => (calls++, `answer to ${p}`), { semantic: { embed: embedder.embed, threshold: 0.9 }, stats });
    const out = await run(fromIterable([france, similar, other]).pipe(stage(work, { name: 'infer' })));
    assert.deepEqual(
      out.map((o) => o.value),
      [`answer to ${france}`, `answer to ${france}`, `answer to ${other}`],
    );
    assert.deepEqual(
      out.map((o) => o.notes?.['infer.cache']),
      ['miss', 'semantic-hit', 'miss'],
    );
    const similarity = out[1]!.notes?.['infer.similarity'] as number;
    assert.ok(Math.abs(similarity - 6 / Math.sqrt(42)) < 1e-6, `similarity ${similarity}`);
    assert.deepEqual([calls, stats.semanticHits, stats.misses, stats.entries], [2, 1, 2, 2]);
  });

  it('misses below the threshold', async () => {
    const embedder = hashingEmbedder();
    let calls = 0;
    const work = cached((p: string) => (calls++, p), { semantic: { embed: embedder.embed, threshold: 0.95 } });
    const out = await run(fromIterable([france, similar]).pipe(stage(work, { name: 'infer' })));
    assert.deepEqual(
      out.map((o) => o.notes?.['infer.cache']),
      ['miss', 'miss'],
    );
    assert.equal(calls, 2);
  });

  it('does not serve an answer across models or parameters, however similar the prompt', async () => {
    const embedder = hashingEmbedder();
    const work = cached((r: { model: string; prompt: string; params?: Record<string, unknown> }) => `${r.model}: ${r.prompt}`, {
      semantic: { embed: embedder.embed, threshold: 0.9 },
    });
    const requests = [
      { model: 'a', prompt: france },
      { model: 'b', prompt: france },
      { model: 'a', prompt: france, params: { temperature: 1 } },
      { model: 'a', prompt: similar },
    ];
    const out = await run(fromIterable(requests).pipe(stage(work, { name: 'infer' })));
    assert.deepEqual(
      out.map((o) => o.notes?.['infer.cache']),
      ['miss', 'miss', 'miss', 'semantic-hit'],
    );
    assert.equal(out[3]!.value, `a: ${france}`);
  });

  it('keeps at most maxEntries, evicting the least recently used', () => {
    const stats = new CacheStats();
    const cache = new SemanticCache<string>({ embed: hashingEmbedder(4).embed, threshold: 0.99, maxEntries: 2, stats });
    const axis = (i: number) => normalize(Float32Array.from({ length: 4 }, (_, j) => (j === i ? 1 : 0)));
    cache.store(axis(0), 'zero');
    cache.store(axis(1), 'one');
    assert.deepEqual(cache.nearest(axis(0)), { value: 'zero', similarity: 1 }); // zero becomes the most recent
    cache.store(axis(2), 'two');
    assert.equal(cache.nearest(axis(1)), undefined);
    assert.equal(cache.nearest(axis(0))?.value, 'zero');
    assert.equal(cache.nearest(axis(2))?.value, 'two');
    assert.deepEqual([cache.size, stats.entries, stats.evictions], [2, 2, 1]);
  });
});

describe('cached: single-flight', () => {
  it('N concurrent identical requests run the work exactly once and all get its answer', async () => {
    let calls = 0;
    let release: (answer: string) => void = () => {};
    const stats = new CacheStats();
    const work = cached(
      (_: string) => {
        calls++;
        return new Promise<string>((resolve) => (release = resolve));
      },
      { singleFlight: true, stats },
    );
    const done = run(fromIterable(Array.from({ length: 8 }, () => 'same prompt')).pipe(stage(work, { name: 'infer', concurrency: 8 })));
    assert.deepEqual([calls, stats.misses, stats.joins], [1, 1, 7]);
    release('the answer');
    const out = await done;
    assert.deepEqual(
      out.map((o) => o.value),
      Array.from({ length: 8 }, () => 'the answer'),
    );
    assert.deepEqual(
      out.map((o) => o.notes?.['infer.cache']),
      ['miss', ...Array.from({ length: 7 }, () => 'joined')],
    );
    assert.equal(calls, 1);
  });

  it('a late joiner receives every token from the start, then the live ones', () => {
    let calls = 0;
    scheduler().run(({ cold, expectObservable, expectSubscriptions }) => {
      const tokens = cold('-x-y-(z|)');
      const work = cached((_: string) => (calls++, tokens), { singleFlight: true });
      expectObservable(cold('p|').pipe(stage(work), values())).toBe('-x-y-(z|)');
      expectObservable(cold('--p|').pipe(stage(work), values())).toBe('--xy-(z|)');
      expectSubscriptions(tokens.subscriptions).toBe('^----!');
    });
    assert.equal(calls, 1);
  });

  it('the work goes on for the others when the first requester cancels', () => {
    const signals: AbortSignal[] = [];
    scheduler().run(({ cold, expectObservable, expectSubscriptions }) => {
      const tokens = cold('-x-y-(z|)');
      const work = cached((_: string, { signal }) => (signals.push(signal), tokens), { singleFlight: true });
      expectObservable(cold('p|').pipe(stage(work), values()), '^--!').toBe('-x-');
      expectObservable(cold('--p|').pipe(stage(work), values())).toBe('--xy-(z|)');
      expectSubscriptions(tokens.subscriptions).toBe('^----!');
    });
    assert.equal(signals.length, 1);
    assert.equal(signals[0]!.aborted, false);
  });

  it('aborts the shared work when every requester has cancelled', () => {
    const signals: AbortSignal[] = [];
    const stats = new CacheStats();
    scheduler().run(({ cold, expectObservable, expectSubscriptions }) => {
      const tokens = cold('-x-y-(z|)');
      const work = cached((_: string, { signal }) => (signals.push(signal), tokens), { singleFlight: true, response: { maxBytes: 100_000 }, stats });
      expectObservable(cold('p|').pipe(stage(work), values()), '^--!').toBe('-x-');
      expectObservable(cold('--p|').pipe(stage(work), values()), '^---!').toBe('--xy');
      expectSubscriptions(tokens.subscriptions).toBe('^---!');
    });
    assert.equal(signals.length, 1);
    assert.equal(signals[0]!.aborted, true);
    assert.equal(stats.entries, 0, 'a cancelled stream is not stored');
  });

  it('an error reaches every requester sharing the work', () => {
    const failure = new Error('model down');
    scheduler().run(({ cold, expectObservable }) => {
      const tokens = cold('-x-#', undefined, failure);
      const work = cached((_: string) => tokens, { singleFlight: true });
      expectObservable(cold('p|').pipe(stage(work, { name: 'infer' }), values())).toBe('-x-#', undefined, new StageError('infer', 0, failure));
      expectObservable(cold('--p|').pipe(stage(work, { name: 'infer' }), values())).toBe('--x#', undefined, new StageError('infer', 0, failure));
    });
  });

  it('forgets a flight once it has ended: the next identical request runs the work again', () => {
    let calls = 0;
    const flights = new SingleFlight<string>();
    scheduler().run(({ cold, expectObservable }) => {
      const work = cached<string, string>((_: string) => (calls++, cold('-x|')), { singleFlight: flights });
      expectObservable(cold('p 4ms (p|)').pipe(stage(work), values())).toBe('-x 3ms -x|');
    });
    assert.deepEqual([calls, flights.size], [2, 0]);
  });
});

describe('cached: all together', () => {
  it('counts every request exactly once across hits, semantic hits, joins and misses', async () => {
    const stats = new CacheStats();
    const embedder = hashingEmbedder();
    let calls = 0;
    const answers = new Map<string, (answer: string) => void>();
    const work = cached(
      (p: string) => {
        calls++;
        return new Promise<string>((resolve) => answers.set(p, resolve));
      },
      { response: { maxBytes: 100_000 }, semantic: { embed: embedder.embed, threshold: 0.9 }, singleFlight: true, stats },
    );
    const infer = stage(work, { name: 'infer', concurrency: 4 });
    const first = run(fromIterable(['What is the capital of France', 'What is the capital of France']).pipe(infer));
    while (answers.size === 0) await new Promise((r) => setImmediate(r));
    answers.get('What is the capital of France')!('Paris');
    assert.deepEqual(
      (await first).map((o) => [o.value, o.notes?.['infer.cache']]),
      [
        ['Paris', 'miss'],
        ['Paris', 'joined'],
      ],
    );
    const second = await run(fromIterable(['What is the capital of France', 'what is the capital of france please']).pipe(infer));
    assert.deepEqual(
      second.map((o) => [o.value, o.notes?.['infer.cache']]),
      [
        ['Paris', 'hit'],
        ['Paris', 'semantic-hit'],
      ],
    );
    assert.equal(calls, 1);
    assert.deepEqual([stats.hits, stats.semanticHits, stats.misses, stats.joins, stats.requests], [1, 1, 1, 1, 4]);
    assert.equal(stats.entries, 2, 'one response entry and one semantic entry');
    assert.deepEqual(
      CacheStats.metrics.map((m) => m.name).filter((n) => !/^sluice_cache_[a-z_]+$/.test(n)),
      [],
    );
  });
});

describe('cached: options', () => {
  const work = (x: string) => x;
  const bad: [string, Record<string, unknown>, string][] = [
    ['nothing enabled', {}, ''],
    ['a response cache without maxBytes', { response: {} }, 'response.maxBytes'],
    ['a negative ttl', { response: { maxBytes: 10, ttl: -1 } }, 'response.ttl'],
    ['a threshold above 1', { semantic: { embed: async () => new Float32Array(1), threshold: 1.5 } }, 'semantic.threshold'],
    ['a semantic cache without an embedder', { semantic: { threshold: 0.9 } }, 'semantic.embed'],
    ['singleFlight that is not a boolean', { singleFlight: 'yes' }, 'singleFlight'],
    ['a misspelt field', { singleflight: true }, 'singleflight'],
    ['a misspelt nested field', { response: { maxbytes: 10, maxBytes: 10 } }, 'response.maxbytes'],
  ];
  for (const [what, options, path] of bad) {
    it(`rejects ${what} at construction, naming the field`, () => {
      assert.throws(
        () => cached(work, options as never),
        (err: unknown) => {
          assert.ok(err instanceof InvalidOptionsError);
          assert.ok(
            err.issues.some((i) => i.path === path),
            `expected an issue at "${path}", got ${JSON.stringify(err.issues)}`,
          );
          return true;
        },
      );
    });
  }

  it('accepts shared cache instances and keeps the work name for the stage', () => {
    const response = new LruCache<CachedAnswer<string>>({ maxBytes: 1000 });
    const named = cached(
      function summarise(x: string) {
        return x;
      },
      { response },
    );
    assert.equal(named.name, 'summarise');
  });
});
