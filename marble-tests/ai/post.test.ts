import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import * as z from 'zod';
import { firstValueFrom, from, lastValueFrom, map, of, toArray } from 'rxjs';
import { TestScheduler } from 'rxjs/testing';
import { luhnValid } from '../../src/ai/stages/pii-detectors.js';
import { redact } from '../../src/ai/stages/redact.js';
import { RedactStats } from '../../src/ai/stages/redact-options.js';
import { Redactor, redactText } from '../../src/ai/stages/redactor.js';
import type { Classifier } from '../../src/ai/models/classifier.js';
import { GuardBlockedError, guard, isBlocked } from '../../src/ai/stages/guard.js';
import { OutputInvalidError, jsonOutput, lightRepair, parseJsonOutput } from '../../src/ai/stages/json-output.js';
import type { FailureEvent } from '../../operators/stage.js';
import { fromIterable } from '../../src/flow/sources.js';
import { StageStats } from '../../src/flow/stats.js';
import { TraceContext, Traced, traced } from '../../src/core/trace.js';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { TestSink, TestSource } from '../../src/testing/index.js';

const VALID_CARDS = ['4111 1111 1111 1111', '5500-0000-0000-0004', '378282246310005', '6011111111111117', '4012888888881881'];
const INVALID_CARDS = ['4111 1111 1111 1112', '5500-0000-0000-0005', '378282246310006', '1234567890123'];
const EMAILS = ['john@example.com', 'a.b+c@mail.co.uk', 'x_y%z@sub-d.example.org', 'q@q.io'];
const PHONES = ['(555) 123-4567', '555.123.4567', '1-555-123-4567', '+44 20 7946 0958', '+1 555 123 4567'];
const IPS = ['192.168.1.10', '10.0.0.1', '255.255.255.255', '2001:db8::1', '::1', 'fe80::1ff:fe23:4567:890a', '2001:0db8:85a3:0000:0000:8a2e:0370:7334'];

/** Redacts `tokens` through the operator (a Flow source, plain strings) and joins the output. */
function streamed(tokens: readonly string[], options: Parameters<typeof redact>[0] = {}): string {
  let out = '';
  let done = false;
  fromIterable(tokens)
    .pipe(redact(options))
    .subscribe({ next: (t) => (out += t.value), complete: () => (done = true) });
  assert.ok(done, 'a synchronous source completes synchronously');
  return out;
}

/** Text built from PII, near misses and noise, so matches meet token boundaries and each other. */
const piece = fc.oneof(
  fc.constantFrom(...VALID_CARDS, ...INVALID_CARDS, ...EMAILS, ...PHONES, ...IPS),
  fc.constantFrom(' ', ' ', '\n', ', ', '. ', 'mail ', 'call ', 'at ', '@', '.', ':', '-', '+', '(', ')', '4', '12', 'cafe'),
  fc.string({ unit: fc.constantFrom(...'ab.@-: 0189+()'.split('')), maxLength: 8 }),
);
const text = fc.array(piece, { maxLength: 14 }).map((parts) => parts.join(''));

/** `text` split at random positions (empty tokens included). */
const splitText = text.chain((t) =>
  fc.array(fc.nat(t.length), { maxLength: 12 }).map((cuts) => {
    const points = [0, ...cuts.sort((a, b) => a - b), t.length];
    return { text: t, tokens: points.slice(1).map((end, i) => t.slice(points[i]!, end)) };
  }),
);

describe('redact: the same redaction whatever the token split', () => {
  it('property: joined output of any split equals the redaction of the unsplit text', () => {
    fc.assert(
      fc.property(splitText, ({ text, tokens }) => {
        assert.equal(streamed(tokens), redactText(text));
      }),
      { numRuns: 300 },
    );
  });

  it('property: the output never contains a whole e-mail address or valid card number of the input', () => {
    const secret = fc.constantFrom(...EMAILS, ...VALID_CARDS);
    fc.assert(
      fc.property(fc.array(fc.tuple(text, secret), { minLength: 1, maxLength: 4 }), fc.array(fc.nat(), { maxLength: 10 }), (parts, cuts) => {
        const whole = parts.map(([noise, s]) => `${noise} ${s} `).join('');
        const points = [0, ...cuts.map((c) => c % (whole.length + 1)).sort((a, b) => a - b), whole.length];
        const out = streamed(points.slice(1).map((end, i) => whole.slice(points[i]!, end)));
        // Standing between spaces, the secret is one whole address or number (the noise may contain its digits inside a longer number).
        for (const [, s] of parts) assert.ok(!out.includes(` ${s} `), `${JSON.stringify(s)} leaked in ${JSON.stringify(out)}`);
      }),
      { numRuns: 300 },
    );
  });

  it('property: a custom pattern without `partial` is found across splits too (held for maxLength)', () => {
    const ticket = { name: 'ticket', pattern: /(?<![A-Z])[A-Z]{3}-\d{4}(?!\d)/, maxLength: 9 };
    const ticketText = fc
      .array(fc.oneof(fc.constantFrom('ABC-1234', 'XYZ-9876', 'AB-12', ' ', 'Q'), fc.string({ unit: fc.constantFrom(...'AB-19 '.split('')), maxLength: 6 })), {
        maxLength: 10,
      })
      .map((p) => p.join(''));
    fc.assert(
      fc.property(ticketText, fc.array(fc.nat(), { maxLength: 8 }), (t, cuts) => {
        const points = [0, ...cuts.map((c) => c % (t.length + 1)).sort((a, b) => a - b), t.length];
        const tokens = points.slice(1).map((end, i) => t.slice(points[i]!, end));
        assert.equal(streamed(tokens, { patterns: [ticket] }), redactText(t, { patterns: [ticket] }));
      }),
      { numRuns: 200 },
    );
  });
});

describe('redact: detectors', () => {
  it('redacts card numbers that pass the Luhn check and leaves the others', () => {
    for (const card of VALID_CARDS) {
      assert.ok(luhnValid(card), card);
      assert.equal(redactText(`pay with ${card} today`), 'pay with [CARD] today');
    }
    for (const card of INVALID_CARDS) {
      assert.ok(!luhnValid(card), card);
      assert.equal(redactText(`pay with ${card} today`, { detect: ['card'] }), `pay with ${card} today`);
    }
    // A valid number inside a longer digit run is not a card of its own.
    assert.equal(redactText('id 41111111111111119', { detect: ['card'] }), 'id 41111111111111119');
  });

  it('redacts e-mail addresses, phone numbers, IPv4 and IPv6 addresses with their replacements', () => {
    assert.equal(redactText('write to john.doe@example.com.'), 'write to [EMAIL].');
    for (const phone of PHONES) assert.equal(redactText(`call ${phone} now`), 'call [PHONE] now', phone);
    for (const ip of IPS) assert.equal(redactText(`host ${ip} up`), 'host [IP] up', ip);
    assert.equal(
      redactText('dates 2024-01-15, times 12:30:45, std::vector, version 1.2.3.4.5, 1.2.3.256'),
      'dates 2024-01-15, times 12:30:45, std::vector, version 1.2.3.4.5, 1.2.3.256',
    );
  });

  it('uses configured replacements and user patterns, and counts per kind in stats and trace notes', () => {
    const stats = new RedactStats();
    const trace = new TraceContext(0, false);
    const tokens = ['mail a@b.io, ', 'c@d', '.io; ticket ABC', '-123456 and 4111 1111 1111 1111'].map((t) => new Traced(t, trace));
    let out = '';
    from(tokens)
      .pipe(
        redact({
          name: 'pii',
          replacements: { email: '<email>' },
          patterns: [{ name: 'ticket', pattern: /(?<![A-Z])[A-Z]{3}-\d{6}(?!\d)/, partial: /(?<![A-Z])[A-Z]{0,3}-?\d{0,6}$/ }],
          stats,
        }),
      )
      .subscribe((t) => {
        assert.equal(t.trace, trace, 'each chunk keeps the response trace');
        out += t.value;
      });
    assert.equal(out, 'mail <email>, <email>; ticket [TICKET] and [CARD]');
    assert.deepEqual(trace.notes, { 'pii.email': 2, 'pii.ticket': 1, 'pii.card': 1 });
    assert.deepEqual(stats.redacted, { email: 2, ticket: 1, card: 1 });
    assert.equal(stats.received, 4);
  });

  it('redacts responses separately: a trace boundary flushes the held text', () => {
    const a = traced('x', { seq: 1 }).trace;
    const b = traced('y', { seq: 2 }).trace;
    const out: [string, TraceContext][] = [];
    from([new Traced('reply john@exa', a), new Traced('mple.com end', b)])
      .pipe(redact())
      .subscribe((t) => out.push([t.value, t.trace]));
    assert.deepEqual(out, [
      ['reply ', a],
      ['john@exa', a],
      ['mple.com ', b],
      ['end', b], // a trailing word could still start an address: it waits for completion
    ]);
    assert.equal(streamed(['reply john@exa', 'mple.com end']), 'reply [EMAIL] end');
  });

  it('rejects bad options naming the field', () => {
    assert.throws(
      () => redact({ maxHold: 0, detect: ['email', 'ssn' as 'email'], patterns: [{ name: 'x', pattern: /x/, partial: /x/ }] }),
      (err: unknown) => {
        assert.ok(err instanceof InvalidOptionsError);
        assert.deepEqual(err.issues.map((i) => i.path).sort(), ['detect.1', 'maxHold', 'patterns.0.partial']);
        return true;
      },
    );
  });
});

describe('redact: hold-back, bound, flush and demand', () => {
  it('holds back only the tail that could still start a match, step by step', () => {
    const source = new TestSource<string>();
    const sink = TestSink.subscribe(source.pipe(redact({ capacity: 4 })), { request: 100 });
    source.emit('Hello, ');
    sink.expectNext('Hello, '); // a plain word and its punctuation go out at once
    source.emit('my mail is john@exa');
    sink.expectNext('my mail is '); // only 'john@exa' is ambiguous
    source.emit('mple.com');
    sink.expectNoEvents(); // 'john@example.com' may still grow ('.com.au')
    source.emit(' thanks. Card 4111 1111');
    sink.expectNext('[EMAIL] thanks. Card ');
    source.emit(' 1111 1111!');
    sink.expectNext('[CARD]!');
    source.emit('Server 10.0.0.');
    sink.expectNext('Server ');
    source.emit('7 is up');
    sink.expectNext('[IP] is ');
    source.emit(' and a plain sentence ends here.\n');
    sink.expectNext('up and a plain sentence ends here.\n');
    source.complete();
    sink.expectComplete();
  });

  it('flushes the held tail, redacted, on completion', () => {
    const source = new TestSource<string>();
    const sink = TestSink.subscribe(source.pipe(redact()), { request: 10 });
    source.emit('contact: jo@example.com');
    sink.expectNext('contact: ');
    source.complete();
    sink.expectNext('[EMAIL]').expectComplete();
  });

  it('never holds more than maxHold characters: the oldest text is forced out and counted', () => {
    const stats = new RedactStats();
    const redactor = new Redactor({ detect: ['email'], maxHold: 8 });
    // One endless e-mail local part: without the bound every character could still start an address.
    let out = '';
    for (let i = 0; i < 50; i++) {
      out += redactor.push('abcde');
      assert.ok(redactor.holding <= 8, `holding ${redactor.holding}`);
    }
    out += redactor.flush();
    assert.equal(out, 'abcde'.repeat(50));
    assert.ok(redactor.forced > 0);
    streamed(['x'.repeat(40), '@example.com'], { detect: ['email'], maxHold: 16, stats });
    assert.equal(stats.forced, 1);
  });

  it('built-in detectors never hold more than the default maxHold, so nothing is forced', () => {
    const redactor = new Redactor();
    for (let i = 0; i < 200; i++) {
      redactor.push(`${'a.b-c_d+e@'.slice(i % 10)}12.34.56 `);
      redactor.push('x'.repeat(70));
      assert.ok(redactor.holding <= 640, `holding ${redactor.holding}`);
    }
    assert.equal(redactor.forced, 0);
  });

  it('keeps demand: asks upstream only while its output buffer has room', () => {
    const source = new TestSource<string>();
    const stats = new RedactStats();
    const sink = TestSink.subscribe(source.pipe(redact({ capacity: 1, stats })));
    source.expectDemand(1);
    source.emit('Hello ');
    source.expectDemand(0); // 'Hello ' waits for the sink, which asked for nothing
    sink.request(1).expectNext('Hello ');
    source.expectDemand(1);
    source.emit('john@exa'); // all held: nothing waits, so demand stays
    source.expectDemand(1);
    source.emit('mple.com ');
    source.expectDemand(0);
    sink.expectNoEvents();
    sink.request(1).expectNext('[EMAIL] ');
    source.complete();
    sink.expectComplete();
    assert.equal(stats.received, 3);
    assert.equal(stats.emitted, 2);
    assert.equal(stats.buffered, 0);
  });

  it('drops the held text on unsubscribe and counts it', () => {
    const stats = new RedactStats();
    const source = new TestSource<string>();
    const sink = TestSink.subscribe(source.pipe(redact({ stats })), { request: 10 });
    source.emit('mail me: someone@secret');
    sink.expectNext('mail me: ');
    sink.cancel();
    assert.equal(source.state, 'cancelled');
    assert.equal(stats.dropped, 'someone@secret'.length);
  });

  it('keeps marble timing: a chunk goes out in the frame of the token that made it certain', () => {
    new TestScheduler((a, e) => assert.deepEqual(a, e)).run(({ cold, expectObservable }) => {
      const tokens = cold('-a--b----c-|', { a: 'mail jo', b: 'hn@exa', c: 'mple.com now' });
      expectObservable(
        tokens.pipe(
          redact(),
          map((t) => t.value),
        ),
      ).toBe('-x-------y-(z|)', { x: 'mail ', y: '[EMAIL] ', z: 'now' });
    });
  });
});

/** A deterministic keyword classifier standing in for a model. */
const keywords: Classifier = (text) => ({ label: 'toxic', score: text.includes('hate') ? 0.95 : text.includes('stupid') ? 0.6 : 0.1 });

describe('guard: thresholds, verdicts and reports', () => {
  it('passes, flags and blocks by threshold; blocked elements are reported, not delivered', async () => {
    const stats = new StageStats();
    const failures: FailureEvent<string>[] = [];
    const verdicts: string[] = [];
    const out = await lastValueFrom(
      fromIterable(['hello', 'you are stupid', 'I hate you', 'bye']).pipe(
        guard({
          name: 'mod',
          classify: keywords,
          thresholds: { flag: 0.5, block: 0.9 },
          stats,
          onFailure: (e) => failures.push(e),
          onVerdict: (e) => verdicts.push(e.verdict.action),
        }),
        toArray(),
      ),
    );
    assert.deepEqual(
      out.map((t) => t.value),
      ['hello', 'you are stupid', 'bye'],
    );
    assert.deepEqual(
      out.map((t) => t.trace.notes),
      [
        { 'mod.verdict': 'pass', 'mod.label': 'toxic', 'mod.score': 0.1 },
        { 'mod.verdict': 'flag', 'mod.label': 'toxic', 'mod.score': 0.6 },
        { 'mod.verdict': 'pass', 'mod.label': 'toxic', 'mod.score': 0.1 },
      ],
    );
    assert.deepEqual(verdicts, ['pass', 'flag', 'block', 'pass']);
    assert.equal(failures.length, 1);
    const [blocked] = failures;
    assert.ok(blocked !== undefined && isBlocked(blocked));
    assert.equal(blocked.value, 'I hate you');
    assert.equal(blocked.error.code, 'GUARD_BLOCKED');
    assert.deepEqual(blocked.error.verdict, { label: 'toxic', score: 0.95, action: 'block' });
    assert.deepEqual(blocked.trace.notes, { 'mod.verdict': 'block', 'mod.label': 'toxic', 'mod.score': 0.95 });
    assert.equal(stats.failed, 1);
    assert.equal(stats.delivered, 3);
  });

  it('scores exactly at a threshold take the stricter action; safe labels always pass', async () => {
    const classify: Classifier = (text) => ({ label: text.startsWith('ok') ? 'safe' : 'spam', score: Number(text.split(' ')[1]) });
    const actions: string[] = [];
    await lastValueFrom(
      fromIterable(['x 0.49', 'x 0.5', 'x 0.89', 'x 0.9', 'ok 1']).pipe(
        guard({ classify, thresholds: { flag: 0.5, block: 0.9 }, onVerdict: (e) => actions.push(e.verdict.action) }),
        toArray(),
      ),
    );
    assert.deepEqual(actions, ['pass', 'flag', 'flag', 'block', 'pass']);
  });

  it('with errorPolicy "fail" a block ends the stream with GuardBlockedError', async () => {
    const asyncClassifier: Classifier = async (text, signal) => {
      assert.ok(signal instanceof AbortSignal);
      return keywords(text, signal);
    };
    await assert.rejects(
      lastValueFrom(
        fromIterable(['fine', 'hate', 'never']).pipe(guard({ classify: asyncClassifier, thresholds: { flag: 0.5, block: 0.9 }, errorPolicy: 'fail' })),
      ),
      (err: unknown) => err instanceof GuardBlockedError && err.stage === 'guard' && err.verdict.score === 0.95,
    );
  });

  it('classifies a field of structured elements through `text`, synchronously for passes', () => {
    new TestScheduler((a, e) => assert.deepEqual(a, e)).run(({ cold, expectObservable }) => {
      const source = cold('-a-b-|', { a: { id: 1, body: 'nice' }, b: { id: 2, body: 'stupid' } });
      expectObservable(
        source.pipe(
          guard({ classify: keywords, thresholds: { flag: 0.5, block: 0.9 }, text: (m: { id: number; body: string }) => m.body }),
          map((t) => t.value.id),
        ),
      ).toBe('-a-b-|', { a: 1, b: 2 });
    });
  });

  it('rejects thresholds out of order or range, naming the field', () => {
    assert.throws(
      () => guard({ classify: keywords, thresholds: { flag: 0.9, block: 0.5 } }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'thresholds.flag'),
    );
    assert.throws(
      () => guard({ classify: keywords, thresholds: { flag: 0.1, block: 2 } }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((i) => i.path === 'thresholds.block'),
    );
  });
});

const Answer = z.object({ city: z.string(), population: z.number().int(), tags: z.array(z.string()) });

describe('jsonOutput: parse, validate, one repair', () => {
  it('parses a fenced answer streamed as tokens and types the value', async () => {
    const tokens = ['Here you go:\n```json\n{"city": "Os', 'lo", "population": 709', '000, "tags": ["capital"]}\n```'];
    const out = await firstValueFrom(of(from(tokens)).pipe(jsonOutput(Answer, { name: 'answer' })));
    assert.deepEqual(out.value, { city: 'Oslo', population: 709000, tags: ['capital'] });
    assert.equal(out.trace.notes?.['answer.repaired'], false);
  });

  it('light repair: trailing commas, prose around the block, a truncated answer', async () => {
    assert.equal(lightRepair('Sure! {"a": [1, 2,], "b": "x"} hope it helps'), '{"a": [1, 2], "b": "x"}');
    assert.equal(lightRepair('```json\n{"a": {"b": [1, "t'), '{"a": {"b": [1, "t"]}}');
    assert.equal(lightRepair('{"a": 1, "b":'), '{"a": 1}');
    const { value, repaired } = await parseJsonOutput(Answer, 'Result: {"city": "Bergen", "population": 285900, "tags": ["rain",],}');
    assert.equal(repaired, true);
    assert.equal(value.city, 'Bergen');
  });

  it('calls a user repair once with the problem, and uses its answer', async () => {
    const calls: string[] = [];
    const outcome = await parseJsonOutput(Answer, '{"city": "Oslo", "population": "many", "tags": []}', {
      repair: async (text, problem) => {
        calls.push(problem.kind === 'schema' ? problem.error.issues.map((i) => i.path.join('.')).join() : 'parse');
        return text.replace('"many"', '709000');
      },
    });
    assert.deepEqual(calls, ['population']);
    assert.deepEqual(outcome, { value: { city: 'Oslo', population: 709000, tags: [] }, repaired: true });
  });

  it('fails with OUTPUT_INVALID naming every zod issue path when the repair does not help', async () => {
    let repairs = 0;
    await assert.rejects(parseJsonOutput(Answer, '{"city": 3, "tags": [1]}', { name: 'answer', repair: (text) => (repairs++, text) }), (err: unknown) => {
      assert.ok(err instanceof OutputInvalidError);
      assert.equal(err.code, 'OUTPUT_INVALID');
      assert.equal(err.stage, 'answer');
      assert.deepEqual(err.issues.map((i) => i.path).sort(), ['city', 'population', 'tags.0']);
      assert.match(err.message, /city: .*population: .*tags\.0/s);
      return true;
    });
    assert.equal(repairs, 1);
    await assert.rejects(parseJsonOutput(Answer, 'I cannot answer that.'), (err: unknown) => err instanceof OutputInvalidError && err.issues[0]!.path === '');
  });

  it('as a stage: invalid responses are skipped and reported, valid ones delivered in order', async () => {
    const failures: string[] = [];
    const out = await lastValueFrom(
      fromIterable(['{"n": 1}', '{"n": 2,}', 'no json', '{"n": "3"}']).pipe(
        jsonOutput(z.object({ n: z.number() }), { errorPolicy: 'skip', onFailure: (e) => failures.push(e.error.code) }),
        toArray(),
      ),
    );
    assert.deepEqual(
      out.map((t) => t.value),
      [{ n: 1 }, { n: 2 }],
    );
    assert.deepEqual(
      out.map((t) => t.trace.notes?.['json-output.repaired']),
      [false, true],
    );
    assert.deepEqual(failures, ['OUTPUT_INVALID', 'OUTPUT_INVALID']);
  });
});
