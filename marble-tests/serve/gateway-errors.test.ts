/**
 * Gateway mode: how an upstream's failure is judged, whether an HTTP status or an error inside
 * its stream said it (OpenAI's `{"error":…}`, vLLM's `{"object":"error",…}`, an SSE
 * `event: error`), against a scripted upstream on loopback behind the real HTTP edge: tokens
 * before an error all reach the client once, the client's own mistakes are passed back with
 * the upstream's words and never retried nor counted against the circuit, a refused key goes to
 * the next upstream, and silence ends in a 504 after the attempts the operator chose.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { spawnSync } from 'node:child_process';
import fc from 'fast-check';
import { VirtualTimeScheduler } from 'rxjs';
import { eventually } from '../../src/testing/index.js';
import { Gateway, type GatewayOptions } from '../../src/ai/inference/gateway.js';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { SseParser } from '../../src/ai/inference/openai.js';
import { createHttpHandler } from '../../src/serve/http.js';
import { toApiError } from '../../src/serve/openai-wire.js';
import { serveOptions } from '../../src/cli.js';
import { FakeUpstream, type Script } from '../support/fake-upstream.js';

type Shape = 'openai' | 'vllm' | 'event';
type Kind = 'request' | 'configuration' | 'transient';

/** The judgement the issue asks for, written out apart from the code under test. */
const KIND_OF_STATUS: Readonly<Record<number, Kind>> = {
  400: 'request',
  404: 'request',
  422: 'request',
  401: 'configuration',
  403: 'configuration',
  429: 'transient',
  500: 'transient',
  503: 'transient',
};
const STATUSES = Object.keys(KIND_OF_STATUS).map(Number);

/** OpenAI's names (type, code) an error of that status carries. */
const OPENAI_NAMES: Readonly<Record<number, readonly [string, string | null]>> = {
  400: ['invalid_request_error', 'context_length_exceeded'],
  401: ['invalid_request_error', 'invalid_api_key'],
  403: ['permission_error', null],
  404: ['invalid_request_error', 'model_not_found'],
  422: ['invalid_request_error', 'unprocessable_entity'],
  429: ['requests', 'rate_limit_exceeded'],
  500: ['server_error', null],
  503: ['server_error', 'service_unavailable'],
};
/** Anthropic's error types, as its `event: error` carries them; a status it has no name for is given as a number. */
const EVENT_TYPES: Readonly<Record<number, string>> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  429: 'rate_limit_error',
  500: 'api_error',
  503: 'overloaded_error',
};

const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: 'chatcmpl-x', object: 'chat.completion.chunk', created: 0, model: 'm', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
const token = (text: string) => chunk({ content: text });
const DONE = `${chunk({}, 'stop')}data: [DONE]\n\n`;

/** An in-stream error of `status` in `shape`; `code` is what a client should see as the error's code. */
function streamError(shape: Shape, status: number, message: string): { text: string; code: string | null } {
  if (shape === 'openai') {
    const [type, code] = OPENAI_NAMES[status]!;
    return { text: `data: ${JSON.stringify({ error: { message, type, param: null, code } })}\n\n`, code };
  }
  if (shape === 'vllm')
    return { text: `data: ${JSON.stringify({ object: 'error', message, type: 'BadRequestError', param: null, code: status })}\n\n`, code: null };
  const type = EVENT_TYPES[status];
  const error = type === undefined ? { message, code: status } : { type, message };
  return { text: `event: error\ndata: ${JSON.stringify({ type: 'error', error })}\n\n`, code: null };
}

interface Answer {
  readonly status: number;
  /** Text pieces of the streamed chunks, in order. */
  readonly pieces: string[];
  /** The whole answer's text. */
  readonly content: string | undefined;
  /** The error: the body's, or the stream's error event. */
  readonly error: { message: string; code: string | null; type: string } | undefined;
}

async function ask(url: string, stream: boolean): Promise<Answer> {
  const response = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm', stream, messages: [{ role: 'user', content: 'hi' }] }),
  });
  const text = await response.text();
  if (response.status !== 200 || !stream) {
    const json = JSON.parse(text) as { error?: Answer['error']; choices?: { message: { content: string } }[] };
    return { status: response.status, pieces: [], content: json.choices?.[0]?.message.content, error: json.error };
  }
  const pieces: string[] = [];
  let error: Answer['error'];
  const parser = new SseParser();
  for (const data of [...parser.push(Buffer.from(text)), ...parser.end()]) {
    if (data === '[DONE]') continue;
    const event = JSON.parse(data) as { error?: Answer['error']; choices?: { delta?: { content?: string } }[] };
    if (event.error !== undefined) error = event.error;
    const content = event.choices?.[0]?.delta?.content;
    if (typeof content === 'string' && content.length > 0) pieces.push(content);
  }
  return { status: 200, pieces, content: undefined, error };
}

/** A gateway over `upstreams` behind the real HTTP edge, on loopback. */
async function serveGateway(upstreams: readonly FakeUpstream[], options: Omit<GatewayOptions, 'upstreams'>) {
  const gateway = await Gateway.start({
    ...options,
    upstreams: upstreams.map((u, i) => ({ baseUrl: u.url, name: String.fromCharCode(97 + i), models: ['m'] })),
  });
  const server: Server = createServer(createHttpHandler({ workers: gateway.modelWorkers() }));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    gateway,
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    failures: (name: string) => gateway.breakers.get(name)!.counts.failures,
    close: async () => {
      gateway.close();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const FAST = { baseDelay: 1, maxDelay: 5, idleTimeout: 150, breakerThreshold: 10_000 } as const;

describe('gateway: errors inside the stream', () => {
  let a: FakeUpstream;
  let b: FakeUpstream;
  let served: Awaited<ReturnType<typeof serveGateway>>;
  before(async () => {
    a = await FakeUpstream.start(['m']);
    b = await FakeUpstream.start(['m']);
    served = await serveGateway([a, b], { ...FAST, attempts: 3 });
  });
  after(async () => {
    await served?.close();
    await a?.close();
    await b?.close();
  });

  for (const shape of ['openai', 'vllm', 'event'] as const) {
    it(`a token in the same read as an error (${shape}) reaches the client before the error`, async () => {
      const error = streamError(shape, 500, 'the model crashed');
      a.clear().script({ kind: 'raw', chunks: [token('first ') + token('second') + error.text], end: true });
      const answer = await ask(served.url, true);
      assert.equal(answer.status, 200);
      assert.deepEqual(answer.pieces, ['first ', 'second']);
      assert.equal(answer.error?.code, 'upstream_error', JSON.stringify(answer));
    });

    it(`an in-stream 400 (${shape}) is the client's: its message and code, one attempt, no fallback, not counted`, async () => {
      const error = streamError(shape, 400, 'This model’s maximum context length is 8 tokens.');
      const [beforeA, beforeB, counted] = [a.served.length, b.served.length, served.failures('a')];
      a.clear().script({ kind: 'raw', chunks: [error.text], end: true });
      const answer = await ask(served.url, false);
      assert.equal(answer.status, 400, JSON.stringify(answer));
      assert.equal(answer.error?.message, 'This model’s maximum context length is 8 tokens.');
      assert.equal(answer.error?.code, error.code);
      assert.equal(a.served.length - beforeA, 1, 'not retried');
      assert.equal(b.served.length - beforeB, 0, 'not sent elsewhere');
      assert.equal(served.failures('a'), counted, 'not counted against the circuit');
    });
  }

  it('five in-stream 400s leave the circuit closed; five in-stream 500s open it', async () => {
    const up = await FakeUpstream.start(['m']);
    const one = await serveGateway([up], { ...FAST, attempts: 1, breakerThreshold: 5, breakerWindow: 60_000, breakerCooldown: 60_000 });
    try {
      for (let i = 0; i < 5; i++) {
        up.script({ kind: 'raw', chunks: [streamError('vllm', 400, 'bad request').text], end: true });
        assert.equal((await ask(one.url, false)).status, 400);
      }
      assert.equal(one.gateway.circuits().a, 'closed');
      for (let i = 0; i < 5; i++) {
        up.script({ kind: 'raw', chunks: [streamError('vllm', 500, 'boom').text], end: true });
        assert.equal((await ask(one.url, false)).status, 502);
      }
      assert.equal(one.gateway.circuits().a, 'open');
      assert.equal(one.gateway.breakers.get('a')!.counts.opens, 1);
    } finally {
      await one.close();
      await up.close();
    }
  });

  it('an in-stream 401 is not retried; the next upstream answers; the refusing upstream is counted', async () => {
    const [beforeA, counted] = [a.served.length, served.failures('a')];
    a.clear().script({ kind: 'raw', chunks: [streamError('openai', 401, 'Incorrect API key provided: sk-abc***').text], end: true });
    b.clear().script({ kind: 'stream', pieces: ['from', ' b'] });
    const answer = await ask(served.url, false);
    assert.equal(answer.content, 'from b');
    assert.equal(a.served.length - beforeA, 1);
    assert.equal(served.failures('a'), counted + 1);
  });

  it("every upstream refusing the gateway's key is a 502 upstream_misconfigured, never the upstream's 401 nor its words", async () => {
    a.clear().script({
      kind: 'status',
      status: 401,
      body: JSON.stringify({ error: { message: 'Incorrect API key provided: sk-abc***', code: 'invalid_api_key' } }),
    });
    b.clear().script({ kind: 'raw', chunks: [streamError('event', 403, 'forbidden for sk-abc').text], end: true });
    const answer = await ask(served.url, false);
    assert.equal(answer.status, 502);
    assert.equal(answer.error?.code, 'upstream_misconfigured');
    assert.doesNotMatch(answer.error?.message ?? '', /sk-abc/);
  });

  it('an in-stream 429 is retried like a status 429', async () => {
    const beforeA = a.served.length;
    a.clear().script({ kind: 'raw', chunks: [streamError('openai', 429, 'Rate limit reached').text], end: true }, { kind: 'stream', pieces: ['ok'] });
    const answer = await ask(served.url, false);
    assert.equal(answer.content, 'ok');
    assert.equal(a.served.length - beforeA, 2);
  });

  it('an SSE `event: error` with plain text, or a TGI-style error string, is an error, not a malformed chunk', async () => {
    a.clear().script({ kind: 'raw', chunks: [`${token('x')}event: error\ndata: upstream exploded\n\n`], end: true });
    const streamed = await ask(served.url, true);
    assert.deepEqual(streamed.pieces, ['x']);
    assert.equal(streamed.error?.code, 'upstream_error');
    a.clear().script({
      kind: 'raw',
      chunks: [`data: ${JSON.stringify({ error: 'Input validation error: `inputs` must have less than 10 tokens', error_type: 'validation' })}\n\n`],
      end: true,
    });
    const refused = await ask(served.url, false);
    assert.equal(refused.status, 400);
    assert.match(refused.error?.message ?? '', /Input validation error/);
  });
});

describe('gateway: a silent upstream, in virtual time', () => {
  it('silence before the first token fails each attempt after the timeout, then the request with 504, after attempts × timeout', async () => {
    const up = await FakeUpstream.start(['m']);
    const clock = new VirtualTimeScheduler();
    const gateway = await Gateway.start({
      upstreams: [{ baseUrl: up.url, name: 'silent', models: ['m'] }],
      attempts: 4,
      idleTimeout: 45_000,
      baseDelay: 100,
      maxDelay: 100,
      breakerThreshold: 100,
      random: () => 0,
      scheduler: clock,
    });
    /** Runs the clock up to `time`: every timer due by then fires, in order. */
    const advanceTo = (time: number) => {
      clock.maxFrames = time;
      clock.flush();
      clock.frame = time;
    };
    let error: unknown;
    let ended = false;
    const subscription = gateway
      .modelWorkers()
      .m!.generate(generateRequest({ messages: [{ role: 'user', content: 'hi' }] }))
      .subscribe({ error: (err: unknown) => ((error = err), (ended = true)), complete: () => (ended = true) });
    try {
      for (let attempt = 1; attempt <= 4; attempt++) {
        up.script({ kind: 'stall' });
        await eventually(() => assert.equal(up.served.length, attempt), { tick: () => new Promise((resolve) => setTimeout(resolve, 5)), maxTicks: 2_000 });
        assert.ok(!ended, `still waiting during attempt ${attempt}`);
        // The attempt's timeout fires, then the backoff before the next attempt.
        advanceTo(clock.frame + 45_000);
        await eventually(() => assert.ok(up.served[attempt - 1]!.closed, 'the silent attempt was aborted'), {
          tick: () => new Promise((resolve) => setTimeout(resolve, 5)),
          maxTicks: 2_000,
        });
        if (attempt < 4) advanceTo(clock.frame + 100);
      }
      await eventually(() => assert.ok(ended), { tick: () => new Promise((resolve) => setTimeout(resolve, 5)), maxTicks: 2_000 });
      const api = toApiError(error);
      assert.equal(api.status, 504, String(error));
      assert.equal(api.code, 'upstream_timeout');
      assert.equal(clock.now(), 4 * 45_000 + 3 * 100, 'the virtual time spent: four timeouts and three backoffs');
      assert.equal(up.served.length, 4);
    } finally {
      subscription.unsubscribe();
      gateway.close();
      await up.close();
    }
  });
});

describe('sluice serve --upstream-timeout, --upstream-attempts', () => {
  it('set the gateway timeout and attempts, from flags or the environment; bad values and missing upstreams exit 2 naming them', () => {
    const up = ['--upstream', 'http://127.0.0.1:9/v1#models=m'];
    assert.deepEqual(serveOptions([...up, '--upstream-timeout', '5000', '--upstream-attempts', '1'], {}).gateway, { idleTimeout: 5000, attempts: 1 });
    assert.deepEqual(serveOptions(up, { SLUICE_UPSTREAM_TIMEOUT: '700', SLUICE_UPSTREAM_ATTEMPTS: '2' }).gateway, { idleTimeout: 700, attempts: 2 });
    assert.throws(() => serveOptions([...up, '--upstream-timeout', '0'], {}), /--upstream-timeout: expected at least 1/);
    assert.throws(() => serveOptions([...up, '--upstream-attempts', 'three'], {}), /--upstream-attempts: expected a whole number/);
    assert.throws(() => serveOptions(['--upstream-attempts', '2'], {}), /--upstream-attempts tunes gateway mode: give --upstream too/);
    assert.throws(() => serveOptions([], { SLUICE_UPSTREAM_TIMEOUT: '10' }), /SLUICE_UPSTREAM_TIMEOUT tunes gateway mode/);
    const help = spawnSync(process.execPath, ['bin/sluice.js', 'serve', '--help'], { encoding: 'utf8' });
    assert.match(help.stdout, /--upstream-timeout <ms>/);
    assert.match(help.stdout, /--upstream-attempts <n>/);
  });
});

// ---- The property: random upstream behaviours against a real loopback upstream ----

type Ending = { readonly kind: 'done' } | { readonly kind: 'error'; readonly shape: Shape; readonly status: number } | { readonly kind: 'silence' };
type Behaviour =
  | { readonly kind: 'status'; readonly status: number }
  | { readonly kind: 'stall' }
  | { readonly kind: 'stream'; readonly tokens: number; readonly ending: Ending; readonly cuts: readonly number[]; readonly gapMs: number | undefined };

/** How one attempt ends, as the client should see the failure (or not). */
type Failure = { readonly kind: Kind; readonly status: number; readonly code: string | null; readonly message: string } | { readonly kind: 'timeout' };

const ATTEMPTS = 2;
const UPSTREAMS = ['a', 'b'] as const;

const ending: fc.Arbitrary<Ending> = fc.oneof(
  { weight: 3, arbitrary: fc.constant({ kind: 'done' as const }) },
  {
    weight: 6,
    arbitrary: fc.record({
      kind: fc.constant('error' as const),
      shape: fc.constantFrom<Shape>('openai', 'vllm', 'event'),
      status: fc.constantFrom(...STATUSES),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ kind: 'silence' as const }) },
);
const behaviour: fc.Arbitrary<Behaviour> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('status' as const), status: fc.constantFrom(...STATUSES) }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'stall' as const }) },
  {
    weight: 8,
    arbitrary: fc.record({
      kind: fc.constant('stream' as const),
      tokens: fc.nat({ max: 4 }),
      ending,
      cuts: fc.uniqueArray(fc.nat({ max: 4000 }), { maxLength: 6 }),
      gapMs: fc.constantFrom(undefined, 0, 2),
    }),
  },
);
const scenario = fc.record({
  stream: fc.boolean(),
  a: fc.array(behaviour, { minLength: ATTEMPTS, maxLength: ATTEMPTS }),
  b: fc.array(behaviour, { minLength: ATTEMPTS, maxLength: ATTEMPTS }),
});

/** Tokens of attempt `attempt` of upstream `up` in run `run`: unique, some with a two-byte character a cut may split. */
const tokenText = (run: number, up: string, attempt: number, i: number) => `${up}${attempt}.${run}.${i}${i % 2 === 0 ? 'é' : ''} `;

function play(b: Behaviour, run: number, up: string, attempt: number): { script: Script; tokens: string[]; failure: Failure | undefined } {
  const message = `scripted ${up}${attempt}.${run}`;
  if (b.kind === 'stall') return { script: { kind: 'stall' }, tokens: [], failure: { kind: 'timeout' } };
  if (b.kind === 'status') {
    const [type, code] = OPENAI_NAMES[b.status]!;
    return {
      script: { kind: 'status', status: b.status, body: JSON.stringify({ error: { message, type, param: null, code } }) },
      tokens: [],
      failure: { kind: KIND_OF_STATUS[b.status]!, status: b.status, code, message },
    };
  }
  const tokens = Array.from({ length: b.tokens }, (_, i) => tokenText(run, up, attempt, i));
  let body = tokens.map(token).join('');
  let failure: Failure | undefined;
  if (b.ending.kind === 'done') body += DONE;
  else if (b.ending.kind === 'silence') failure = { kind: 'timeout' };
  else {
    const error = streamError(b.ending.shape, b.ending.status, message);
    body += error.text;
    failure = { kind: KIND_OF_STATUS[b.ending.status]!, status: b.ending.status, code: error.code, message };
  }
  const bytes = Buffer.from(body);
  const cuts = [...new Set(b.cuts.map((c) => c % (bytes.length + 1)))].sort((x, y) => x - y);
  const chunks = [0, ...cuts].map((start, i) => bytes.subarray(start, [...cuts, bytes.length][i])).filter((c) => c.length > 0);
  return {
    script: { kind: 'raw', chunks, end: b.ending.kind !== 'silence', ...(b.gapMs !== undefined && { gapMs: b.gapMs }) },
    tokens,
    failure,
  };
}

/** The client's view of a failure, as the gateway must word it. */
function expectedError(failure: Failure): { status: number; code: string | null; message?: string } {
  if (failure.kind === 'timeout') return { status: 504, code: 'upstream_timeout' };
  if (failure.kind === 'request') return { status: failure.status, code: failure.code, message: failure.message };
  if (failure.kind === 'configuration') return { status: 502, code: 'upstream_misconfigured' };
  return failure.status === 429 ? { status: 429, code: 'rate_limit_exceeded' } : { status: 502, code: 'upstream_error' };
}

/** What the gateway must do with a scenario: the oracle, written from the rules, not from the code. */
function expected(s: { a: readonly Behaviour[]; b: readonly Behaviour[] }, run: number) {
  const scripts = { a: [] as Script[], b: [] as Script[] };
  const counted = { a: 0, b: 0 };
  const asked = { a: 0, b: 0 };
  const last: Failure[] = [];
  for (const up of UPSTREAMS) {
    let failure: Failure | undefined;
    for (let attempt = 0; attempt < ATTEMPTS; attempt++) {
      const played = play(s[up][attempt]!, run, up, attempt);
      scripts[up].push(played.script);
      asked[up]++;
      if (played.tokens.length > 0 || played.failure === undefined) {
        // It answered: its tokens go out, and its failure, if any, ends the stream. No retry, no fallback.
        if (played.failure !== undefined && played.failure.kind !== 'request') counted[up]++;
        return { scripts, counted, asked, tokens: played.tokens, error: played.failure === undefined ? undefined : expectedError(played.failure) };
      }
      failure = played.failure;
      if (failure.kind === 'request') return { scripts, counted, asked, tokens: [], error: expectedError(failure) };
      if (failure.kind === 'configuration') break;
    }
    counted[up]++;
    last.push(failure!);
  }
  const all = (test: (f: Failure) => boolean) => last.every(test);
  const error = all((f) => f.kind === 'transient' && f.status === 429)
    ? { status: 429, code: 'rate_limit_exceeded' }
    : all((f) => f.kind === 'timeout')
      ? { status: 504, code: 'upstream_timeout' }
      : all((f) => f.kind === 'configuration')
        ? { status: 502, code: 'upstream_misconfigured' }
        : { status: 502, code: 'upstream_error' };
  return { scripts, counted, asked, tokens: [] as string[], error };
}

describe('gateway: random upstream behaviours (fast-check)', () => {
  let ups: FakeUpstream[];
  let served: Awaited<ReturnType<typeof serveGateway>>;
  before(async () => {
    ups = [await FakeUpstream.start(['m']), await FakeUpstream.start(['m'])];
    served = await serveGateway(ups, { ...FAST, attempts: ATTEMPTS, idleTimeout: 250 });
  });
  after(async () => {
    await served?.close();
    for (const up of ups ?? []) await up.close();
  });

  it('every token before an error reaches the client once; the status and error follow the classification; the circuit counts only upstream faults', {
    timeout: 180_000,
  }, async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(scenario, async (s) => {
        run++;
        const want = expected(s, run);
        const [a, b] = ups as [FakeUpstream, FakeUpstream];
        a.clear().script(...want.scripts.a);
        b.clear().script(...want.scripts.b);
        const before = { a: a.served.length, b: b.served.length, countedA: served.failures('a'), countedB: served.failures('b') };
        const answer = await ask(served.url, s.stream);
        const context = JSON.stringify({ want, answer });
        if (want.error === undefined) {
          assert.equal(answer.status, 200, context);
          if (s.stream) assert.deepEqual(answer.pieces, want.tokens, context);
          else assert.equal(answer.content, want.tokens.join(''), context);
          assert.equal(answer.error, undefined, context);
        } else if (s.stream && want.tokens.length > 0) {
          // Tokens went out: the status was 200, the error comes as an event after every one of them.
          assert.equal(answer.status, 200, context);
          assert.deepEqual(answer.pieces, want.tokens, context);
          assert.equal(answer.error?.code, want.error.code, context);
          if ('message' in want.error) assert.equal(answer.error?.message, want.error.message, context);
        } else {
          assert.equal(answer.status, want.error.status, context);
          assert.equal(answer.error?.code, want.error.code, context);
          if ('message' in want.error) assert.equal(answer.error?.message, want.error.message, context);
          assert.deepEqual(answer.pieces, [], context);
        }
        assert.equal(a.served.length - before.a, want.asked.a, `attempts on a: ${context}`);
        assert.equal(b.served.length - before.b, want.asked.b, `attempts on b: ${context}`);
        await eventually(
          () => {
            assert.equal(served.failures('a') - before.countedA, want.counted.a, `counted against a: ${context}`);
            assert.equal(served.failures('b') - before.countedB, want.counted.b, `counted against b: ${context}`);
          },
          { tick: () => new Promise((resolve) => setTimeout(resolve, 5)), maxTicks: 2_000 },
        );
      }),
      { numRuns: 120 },
    );
  });
});
