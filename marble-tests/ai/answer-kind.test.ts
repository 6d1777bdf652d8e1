/** What kind of value a question asks for (src/ai/rag/answer-kind.ts), and the sentence holding one chosen for it. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { answerShare, asksHowTo, expectedAnswer } from '../../src/ai/rag/answer-kind.js';
import { candidatesOf, composeAnswer } from '../../src/ai/rag/extract.js';
import type { QueryTerms } from '../../src/ai/rag/sentence-scores.js';

const v = (...xs: number[]) => Float32Array.from(xs);

describe('the kind of answer a question asks for', () => {
  it('reads numbers, durations, versions, variables and defaults from the question', () => {
    assert.deepEqual(expectedAnswer('How many times does the client retry?'), { kinds: ['number'], defaults: false });
    assert.deepEqual(expectedAnswer('How long does a request wait for a reply by default?'), { kinds: ['duration'], defaults: true });
    assert.deepEqual(expectedAnswer('Which Node.js version does it need?'), { kinds: ['version'], defaults: false });
    assert.deepEqual(expectedAnswer('Which environment variable picks the sampler?'), { kinds: ['variable'], defaults: false });
    assert.deepEqual(expectedAnswer('Which sampler is used when I do not configure one?'), { kinds: [], defaults: true });
    assert.deepEqual(expectedAnswer('What port does it listen on unless I change it?'), { kinds: ['number'], defaults: true });
    for (const question of [
      'Which address does the client connect to if I give it no servers?',
      'What timeout applies when no timeout is given?',
      'Which encoding is used if no encoding option is passed?',
      'What happens if I omit the level?',
      'What does it print if I leave the format out?',
      'block() without SCOPE_FOR: which scopes does it create?',
      'What does npm ci do without --omit?',
      'How often does it retry without `maxRetries`?',
    ])
      assert.equal(expectedAnswer(question)?.defaults, true, question);
    assert.deepEqual(expectedAnswer('What does parseMIMEType return when it cannot parse its input?'), { kinds: ['value'], defaults: false });
    assert.deepEqual(expectedAnswer('what does try_run put in the run result'), { kinds: ['value'], defaults: false });
    assert.equal(expectedAnswer('How do I give it no more work once it is closed?'), undefined);
    assert.equal(expectedAnswer('Can I run it without a network?'), undefined, 'without a word, not an option');
    assert.equal(expectedAnswer('How do I expand brace patterns?'), undefined);
  });

  it('finds the value asked for in a sentence, and only a value of that kind', () => {
    const many = expectedAnswer('How many retries are there?')!;
    assert.equal(answerShare(many, 'It retries up to `5` times.'), 1);
    assert.equal(answerShare(many, 'It retries until it succeeds.'), 0);
    const version = expectedAnswer('Which version of Node.js is required?')!;
    assert.equal(answerShare(version, 'It needs Node.js 18 or later.'), 1);
    assert.equal(answerShare(version, 'Install it with npm.'), 0);
    const variable = expectedAnswer('Which environment variable sets the level?')!;
    assert.equal(answerShare(variable, 'Set `LOG_LEVEL=debug` to see more.'), 1);
    assert.equal(answerShare(variable, 'Pass `level` to the constructor.'), 0);
    const both = expectedAnswer('How many sockets does it open by default?')!;
    assert.equal(answerShare(both, 'It opens 10 sockets by default.'), 1);
    assert.equal(answerShare(both, 'It opens 10 sockets.'), 0.5);
    const reason = expectedAnswer('Why must the body always be consumed?')!;
    assert.deepEqual(reason, { kinds: ['reason'], defaults: false });
    assert.equal(answerShare(reason, 'Leaving it unread stalls the connection, because it is never released.'), 1);
    assert.equal(answerShare(reason, 'Always consume the body.'), 0);
    const list = expectedAnswer('Which log levels are there?')!;
    assert.deepEqual(list, { kinds: ['list'], defaults: false });
    assert.equal(answerShare(list, 'The levels are `trace`, `debug`, `info` and `error`.'), 1);
    assert.equal(answerShare(list, 'The levels are trace, debug, info and error.'), 1);
    assert.equal(answerShare(list, 'A level says how much is logged.'), 0);
    const unset = expectedAnswer('What does it use without SCOPE_FOR?')!;
    for (const text of ['If `SCOPE_FOR` is not specified, this is equivalent to:', 'When omitted, both are created.', 'It defaults to both.'])
      assert.equal(answerShare(unset, text), 1, text);
    const value = expectedAnswer('What does it return on failure?')!;
    assert.equal(answerShare(value, 'The result will be set to `FAILED_TO_RUN`.'), 1);
    assert.equal(answerShare(value, 'It prints "[Circular]" in its place.'), 1);
    assert.equal(answerShare(value, 'It returns once the input is parsed.'), 0);
    const duration = expectedAnswer('How long does it wait?')!;
    assert.equal(answerShare(duration, 'It waits 300 ms.'), 1);
    assert.equal(answerShare(duration, 'It waits for 300 requests.'), 0);
    for (const text of ['It runs every five minutes.', 'It is closed 6 months after.', 'Keep it for two weeks.', 'a 30-day trial', 'It lasts a year.'])
      assert.equal(answerShare(duration, text), 1, text);
  });

  it('prefers the sentence holding the value asked for over a shorter one that only shares its words', () => {
    const passages = [{ id: 'p', text: 'The retry delay grows each time. A retry runs at most 5 times.', source: 'retry.md', score: 1 }];
    const words = (question?: string): QueryTerms => ({
      terms: ['retry', 'time'],
      weight: () => 1,
      termsOf: (text) => (text.toLowerCase().match(/[a-z0-9]+/g) ?? []).map((w) => w.replace(/s$/, '')),
      ...(question !== undefined && { expects: expectedAnswer(question)! }),
    });
    const pick = (terms: QueryTerms) =>
      composeAnswer(v(1, 0), passages, candidatesOf(passages), [v(1, 0), v(1, 0)], { sentences: 1, context: 0 }, terms).text.split('\n\n')[0];
    assert.equal(pick(words()), 'The retry delay grows each time. [1]');
    assert.equal(pick(words('How many times does it retry?')), 'A retry runs at most 5 times. [1]');
  });

  it('reads a question asking how to do something, or which option or command does it', () => {
    for (const question of [
      'How do I enable HTTP/2?',
      'While mocking, how can I stop real requests?',
      'how to disable colours',
      'Which option sets the depth?',
      'What flags does it take?',
    ])
      assert.equal(asksHowTo(question), true, question);
    for (const question of ['Why does the stream stall?', 'How many retries are there?', 'What does the name mean?', 'How does the pool work?'])
      assert.equal(asksHowTo(question), false, question);
  });

  it('answers how to do something with the sentence naming the way in code, over one that only describes it', () => {
    const passages = [
      {
        id: 'p',
        text: 'Compression keeps the frames of a connection small. Set `perMessageDeflate` to turn on compression for a connection.',
        source: 'ws.md',
        score: 1,
      },
    ];
    const words = (question: string): QueryTerms => ({
      terms: ['compression', 'connection'],
      weight: () => 1,
      termsOf: (text) => (text.toLowerCase().match(/[a-z0-9]+/g) ?? []).map((w) => w.replace(/s$/, '')),
      howTo: asksHowTo(question),
    });
    const pick = (question: string) =>
      composeAnswer(v(1, 0), passages, candidatesOf(passages), [v(1, 0), v(1, 0)], { sentences: 1, context: 0 }, words(question)).text.split('\n\n')[0];
    assert.equal(pick('Why is compression used on a connection?'), 'Compression keeps the frames of a connection small. [1]');
    assert.equal(pick('How do I use compression on a connection?'), 'Set `perMessageDeflate` to turn on compression for a connection. [1]');
  });
});
