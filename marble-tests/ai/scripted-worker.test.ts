/** `ScriptedWorker` (sluice/testing): the model worker for users' tests — scripts, delays, failures, abort, demand. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { VirtualTimeScheduler } from 'rxjs';
import { TestSink, eventually, verify } from 'sluice/testing';
import { ScriptedWorker } from 'sluice/testing/ai';
import { AbortedError, InvalidOptionsError } from '../../src/core/errors.js';
import { generateRequest, type GenerationDone, type Token } from '../../src/ai/inference/worker.js';

/** Every token and the end of one generation. */
function collect(worker: ScriptedWorker, request: Parameters<ScriptedWorker['generate']>[0], signal?: AbortSignal) {
  let done: GenerationDone | undefined;
  const tokens: Token[] = [];
  const ended = new Promise<unknown>((resolve) =>
    worker.generate(request, { signal, onDone: (d) => (done = d) }).subscribe({
      next: (token) => tokens.push(token),
      error: (error: unknown) => resolve(error),
      complete: () => resolve(undefined),
    }),
  );
  return ended.then((error) => ({ tokens: tokens.map((t) => t.text), done: done!, error }));
}

describe('ScriptedWorker: what it says', () => {
  it('counts t0, t1... up to the request max_tokens and ends with length', async () => {
    const { tokens, done } = await collect(new ScriptedWorker(), { prompt: 'a b c', max_tokens: 3 });
    assert.deepEqual(tokens, ['t0 ', 't1 ', 't2 ']);
    assert.equal(done.finishReason, 'length');
    assert.deepEqual(done.usage, { inputTokens: 3, outputTokens: 3 });
  });

  it("echoes the prompt word by word, then stops; a chat's messages, one per line", async () => {
    const worker = new ScriptedWorker({ tokens: 'echo' });
    const prompt = await collect(worker, { prompt: 'Once upon a time' });
    assert.deepEqual(prompt.tokens, ['Once ', 'upon ', 'a ', 'time']);
    assert.equal(prompt.done.finishReason, 'stop');
    const chat = await collect(worker, {
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Hi' },
      ],
    });
    assert.equal(chat.tokens.join(''), 'Be brief.\nHi');
  });

  it('says scripted tokens, per generation when given a function, and ends with the scripted reason', async () => {
    const answers = ['one two', 'three'];
    const worker = new ScriptedWorker({ tokens: (_request, generation) => (answers[generation] ?? '').split(/(?<= )/), end: 'content_filter' });
    assert.deepEqual((await collect(worker, { prompt: 'x' })).tokens, ['one ', 'two']);
    const second = await collect(worker, { prompt: 'x' });
    assert.deepEqual(second.tokens, ['three']);
    assert.equal(second.done.finishReason, 'content_filter');
    assert.deepEqual(
      worker.requests.map((r) => r.prompt),
      ['x', 'x'],
    );
  });

  it('pads tokens, reports the scripted input tokens, applies stop sequences as real workers do', async () => {
    const worker = new ScriptedWorker({ tokens: ['ab', 'cd', 'STOP', 'ef'], padTo: 4, inputTokens: 9 });
    const { tokens, done } = await collect(worker, { prompt: 'x', stop: ['..ST'] });
    assert.equal(tokens.join(''), 'ab..cd');
    assert.equal(done.finishReason, 'stop');
    assert.equal(done.usage.inputTokens, 9);
  });

  it('caps a request without max_tokens at maxTokens, and ignores max_tokens when told to (a buggy worker)', async () => {
    assert.equal((await collect(new ScriptedWorker({ maxTokens: 2 }), { prompt: 'x' })).tokens.length, 2);
    const unruly = new ScriptedWorker({ tokens: { repeat: 'x' }, honourMaxTokens: false });
    const controller = new AbortController();
    const sink = TestSink.subscribe(unruly.generate(generateRequest({ prompt: 'x', max_tokens: 1 }), { signal: controller.signal }));
    sink.request(5);
    await eventually(() =>
      assert.deepEqual(
        sink.received.map((t) => t.text),
        ['x', 'x', 'x', 'x', 'x'],
      ),
    );
    sink.cancel();
  });

  it('infer gathers the whole answer', async () => {
    const completion = await new ScriptedWorker({ tokens: ['Hello', ', ', 'world'] }).infer({ prompt: 'hi' });
    assert.deepEqual(completion, { text: 'Hello, world', finishReason: 'stop', usage: { inputTokens: 1, outputTokens: 3 } });
  });
});

describe('ScriptedWorker: time, failure, abort and demand', () => {
  it('waits the scripted delays on the injected scheduler, in virtual time', async () => {
    const scheduler = new VirtualTimeScheduler();
    const worker = new ScriptedWorker({ tokens: ['a', 'b', 'c'], delay: (token) => (token + 1) * 10, scheduler });
    await verify(worker.generate({ prompt: 'x' }), { scheduler, request: 4 })
      .expectNoEvents()
      .thenAwait(10)
      .consumeNextWith((t) => assert.equal(t.text, 'a'))
      .thenAwait(19)
      .expectNoEvents()
      .thenAwait(1)
      .consumeNextWith((t) => assert.equal(t.text, 'b'))
      .thenAwait(30)
      .consumeNextWith((t) => assert.equal(t.text, 'c'))
      .expectNoEvents()
      .thenAwait(40)
      .expectComplete()
      .run();
  });

  it('fails at the chosen token with the chosen error, after the tokens before it', async () => {
    const error = Object.assign(new Error('the accelerator fell over'), { code: 'DEVICE_LOST' });
    const { tokens, error: got } = await collect(new ScriptedWorker({ fail: { after: 2, error }, delay: 'turn' }), { prompt: 'x' });
    assert.deepEqual(tokens, ['t0 ', 't1 ']);
    assert.equal(got, error);
    const first = await collect(new ScriptedWorker({ fail: { after: 0 } }), { prompt: 'x' });
    assert.deepEqual(first.tokens, []);
    assert.match(String(first.error), /failed as scripted/);
  });

  it('hangs at the chosen token until aborted, then errors with AbortedError', async () => {
    const worker = new ScriptedWorker({ hang: { after: 3 } });
    const controller = new AbortController();
    const result = collect(worker, { prompt: 'x' }, controller.signal);
    await eventually(() => assert.equal(worker.last().steps, 4));
    controller.abort(new Error('client left'));
    const { tokens, error, done } = await result;
    assert.deepEqual(tokens, ['t0 ', 't1 ', 't2 ']);
    assert.ok(error instanceof AbortedError);
    assert.equal(done.finishReason, 'abort');
    assert.equal(worker.last().signal, controller.signal);
  });

  it('fails or hangs only the requests its `when` picks', async () => {
    const worker = new ScriptedWorker({
      hang: { after: 1, when: (r) => r.prompt?.startsWith('hang') === true },
      fail: { after: 2, when: (r) => r.prompt === 'fail' },
    });
    assert.equal((await collect(worker, { prompt: 'fine', max_tokens: 4 })).tokens.length, 4);
    assert.deepEqual((await collect(worker, { prompt: 'fail', max_tokens: 4 })).tokens, ['t0 ', 't1 ']);
    const controller = new AbortController();
    const hanging = collect(worker, { prompt: 'hang on', max_tokens: 4 }, controller.signal);
    await eventually(() => assert.equal(worker.last().steps, 2));
    controller.abort();
    assert.deepEqual((await hanging).tokens, ['t0 ']);
  });

  it('an abort during a delay cancels its timer', async () => {
    const scheduler = new VirtualTimeScheduler();
    const worker = new ScriptedWorker({ delay: 1_000, scheduler });
    const controller = new AbortController();
    const result = collect(worker, { prompt: 'x' }, controller.signal);
    await eventually(() => assert.equal(scheduler.actions.length, 1));
    controller.abort();
    assert.ok((await result).error instanceof AbortedError);
    assert.equal(scheduler.actions.filter((action) => !action.closed).length, 0);
  });

  it('is stepped only as far as the consumer asks', async () => {
    const worker = new ScriptedWorker({ delay: 'turn' });
    const sink = TestSink.subscribe(worker.generate({ prompt: 'x' }));
    sink.request(2);
    await eventually(() => assert.equal(sink.received.length, 2));
    for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
    assert.equal(worker.steps, 2);
    sink.request(1).cancel();
  });
});

describe('ScriptedWorker: options', () => {
  it('bad options fail at construction, naming the field', () => {
    const bad = (options: Record<string, unknown>, field: RegExp) =>
      assert.throws(
        () => new ScriptedWorker(options as never),
        (error: unknown) => error instanceof InvalidOptionsError && error.issues.some((issue) => field.test(issue.path)),
      );
    bad({ tokens: 'shout' }, /^tokens$/);
    bad({ delay: -1 }, /^delay$/);
    bad({ fail: { after: -1 } }, /^fail\.after$/);
    bad({ hang: { afterr: 1 } }, /^hang\.afterr$/);
    bad({ padTo: 1.5 }, /^padTo$/);
    bad({ scheduler: {} }, /^scheduler$/);
    bad({ end: 'abort' }, /^end$/);
    bad({ tokenz: [] }, /^tokenz$/);
  });
});
