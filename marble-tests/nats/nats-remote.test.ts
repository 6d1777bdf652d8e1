import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { lastValueFrom, take, toArray } from 'rxjs';
import { Flow, subscribeWithDemand } from '../../src/index.js';
import { invalidPaths } from '../support/invalid-options.js';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { CharLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { generateRequest, type ModelWorker, type Token } from '../../src/ai/inference/worker.js';
import { LinkReceiverStats, openModelLink, remoteModel, serveModel, type RemoteRequest } from '../../src/nats.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { startNatsServer, type NatsServer } from '../support/nats-server.js';
import { startScript } from '../support/child-script.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Starts a worker process; resolves once it is ready. `events` collects what it reports. */
async function startWorker(url: string, name: string, models: string, events: { outcome: string; sent: number; attempt: number }[]): Promise<ChildProcess> {
  const { child, lines } = await startScript('./model-worker.ts', [url, name, models]);
  const collect = setInterval(() => {
    for (const line of lines.splice(0)) if (line.startsWith('{')) events.push(JSON.parse(line));
  }, 10);
  child.once('exit', () => clearInterval(collect));
  collect.unref();
  return child;
}

describe('remote generation: options checked when called, before the link is touched (no server needed)', () => {
  const link = {} as Parameters<typeof remoteModel>[0];
  it('remoteModel names each bad field', () => {
    assert.deepEqual(
      invalidPaths(() => remoteModel(link, { name: '', window: 0, idleTimeout: 1.5, windw: 4 } as never)),
      ['idleTimeout', 'name', 'window', 'windw'],
    );
  });
  it('serveModel names each bad field', () => {
    assert.deepEqual(
      invalidPaths(() =>
        serveModel(link, {} as ModelWorker, { concurrency: 0, idleTimeout: -1, stats: {} as LinkReceiverStats, onRequest: 'log', concurency: 2 } as never),
      ),
      ['concurency', 'concurrency', 'idleTimeout', 'onRequest', 'stats'],
    );
  });
});

describe('remote generation over a link, on a real nats-server and the real character LM', () => {
  let server: NatsServer;
  let requester: NatsConnection;
  let workerSide: NatsConnection;
  let models: string;
  let generated: GeneratedModels | undefined;
  let lm: CharLmWorker;

  before(async () => {
    models = (generated = await generatedModels('remote')).dir;
    lm = await CharLmWorker.load(join(models, MODEL_FILES.charLm));
    server = await startNatsServer();
    requester = await connect({ servers: server.url });
    workerSide = await connect({ servers: server.url });
  });
  after(async () => {
    await requester?.close();
    await workerSide?.close();
    await server?.close();
    await lm?.release();
    await generated?.remove();
  });

  const local = async (seed: number, max_tokens: number) =>
    (await lastValueFrom(lm.generate(generateRequest({ prompt: 'The stage', max_tokens, temperature: 0.9, seed })).pipe(toArray())))
      .map((t) => t.text)
      .join('');

  it('streams the tokens the local model gives for the same seed; the model steps only as far as the consumer asked', async () => {
    const name = 'gen';
    const workerLink = await openModelLink(workerSide, { name, capacity: 8, creditInterval: 50 });
    const serving = serveModel(workerLink, lm);
    try {
      const remote = remoteModel(await openModelLink(requester, { name, capacity: 8, creditInterval: 50 }), { window: 4 });
      const expected = await local(7, 60);
      const tokens: Token[] = [];
      const subscription = subscribeWithDemand(remote.generate(generateRequest({ prompt: 'The stage', max_tokens: 60, temperature: 0.9, seed: 7 })), {
        next: (token) => tokens.push(token),
      });
      subscription.request(3);
      await sleep(400);
      assert.equal(tokens.length, 3, 'the consumer got what it asked for');
      subscription.request(1_000);
      const deadline = Date.now() + 5_000;
      while (tokens.map((t) => t.text).join('') !== expected && Date.now() < deadline) await sleep(20);
      assert.equal(tokens.map((t) => t.text).join(''), expected);
      assert.deepEqual(
        tokens.map((t) => t.index),
        tokens.map((_, i) => i),
      );
      const completion = await remote.infer(generateRequest({ prompt: 'The stage', max_tokens: 60, temperature: 0.9, seed: 7 }));
      assert.equal(completion.text, expected);
      assert.ok(['stop', 'length'].includes(completion.finishReason));
    } finally {
      serving.stop();
    }
  });

  it('a slow consumer pauses the model on the worker: it is stepped no further than the credit', async () => {
    const name = 'paced';
    const produced: number[] = [];
    // A model whose tokens are counted as the worker asks for them.
    const pacing: ModelWorker = {
      name: lm.name,
      infer: (input, options) => lm.infer(input, options),
      generate: (request, options) => {
        const flow = lm.generate(request, options);
        let n = 0;
        return new Flow<Token>((outlet) => {
          const inner = subscribeWithDemand(flow, {
            next: (token) => {
              produced.push(++n);
              outlet.next(token);
            },
            error: (e) => outlet.error(e),
            complete: () => outlet.complete(),
          });
          return {
            start: () => {},
            pull: () => {
              if (outlet.wants()) inner.request(Math.max(0, Math.min(outlet.demand(), 64) - inner.outstanding));
            },
            cancel: () => inner.cancel(),
          };
        });
      },
    };
    const serving = serveModel(await openModelLink(workerSide, { name, capacity: 8, creditInterval: 50 }), pacing);
    try {
      const remote = remoteModel(await openModelLink(requester, { name, capacity: 8, creditInterval: 50 }), { window: 4 });
      const tokens: Token[] = [];
      const subscription = subscribeWithDemand(remote.generate(generateRequest({ prompt: 'The stage', max_tokens: 200, temperature: 0.9, seed: 3 })), {
        next: (token) => tokens.push(token),
      });
      subscription.request(2);
      await sleep(500);
      assert.equal(tokens.length, 2);
      assert.ok(produced.length <= 2 + 4, `the model made ${produced.length} tokens for a consumer that took 2 (window 4)`);
      subscription.cancel();
    } finally {
      serving.stop();
    }
  });

  it("the consumer's cancel reaches the worker: the generation stops there, the request is acknowledged", async () => {
    const name = 'cancel';
    const events: { outcome: string; sent: number }[] = [];
    const stats = new LinkReceiverStats();
    const serving = serveModel(await openModelLink(workerSide, { name, capacity: 8, creditInterval: 50 }), lm, {
      stats,
      onRequest: (event) => events.push(event),
    });
    try {
      const remote = remoteModel(await openModelLink(requester, { name, capacity: 8, creditInterval: 50 }), { window: 4 });
      const first = await lastValueFrom(remote.generate(generateRequest({ prompt: 'The stage', max_tokens: 200, seed: 1 })).pipe(take(5), toArray()));
      assert.equal(first.length, 5);
      const deadline = Date.now() + 3_000;
      while (events.length === 0 && Date.now() < deadline) await sleep(20);
      assert.equal(events[0]?.outcome, 'cancelled');
      assert.ok(events[0]!.sent < 5 + 4 + 1, `the worker sent ${events[0]!.sent} tokens before the cancel reached it`);
      await sleep(50);
      assert.equal(stats.acked, 1);
    } finally {
      serving.stop();
    }
  });

  it('a request the worker cannot run gets a typed error reply; a body that is not a request is dead-lettered', async () => {
    const name = 'bad';
    const events: { outcome: string }[] = [];
    const link = await openModelLink(workerSide, { name, capacity: 8, creditInterval: 50 });
    const serving = serveModel(link, lm, { onRequest: (event) => events.push(event) });
    try {
      await link.js.publish(link.subject, JSON.stringify({ hello: 'not a request' }));
      const reply = 'sluice.reply.bad.raw';
      const answers: unknown[] = [];
      requester.subscribe(reply, {
        callback: (_error, message) => {
          const body = message.json<{ type: string }>();
          if (body.type === 'hello') message.respond(JSON.stringify({ type: 'credit', granted: 8, have: 0 }));
          else answers.push(body);
        },
      });
      await requester.flush();
      const request: RemoteRequest = { id: 'raw', reply, request: { prompt: 'x', top_p: 0 } };
      await link.js.publish(link.subject, JSON.stringify(request));
      const deadline = Date.now() + 3_000;
      while (answers.length === 0 && Date.now() < deadline) await sleep(20);
      assert.equal(answers.length, 1);
      assert.deepEqual((answers[0] as { type: string; code: string }).type, 'error');
      assert.equal((answers[0] as { code: string }).code, 'INVALID_OPTIONS');
      assert.match((answers[0] as { message: string }).message, /top_p/);
      const info = await link.jsm.streams.info(link.deadStream);
      assert.equal(info.state.messages, 1, 'the body that is not a request was dead-lettered');
    } finally {
      serving.stop();
    }
  });

  it('a worker process killed mid-generation: another takes its requests over; every token arrives once, every request ends once', async () => {
    const name = 'crash';
    const events: { outcome: string; sent: number; attempt: number }[] = [];
    const a = await startWorker(server.url, name, models, events);
    let b: ChildProcess | undefined;
    try {
      const remote = remoteModel(await openModelLink(requester, { name, capacity: 16, ackWait: 2_000, creditInterval: 50 }), { window: 4 });
      const seeds = [11, 12, 13, 14];
      const expected = await Promise.all(seeds.map((seed) => local(seed, 120)));
      const texts = seeds.map(() => '');
      const ends = seeds.map(() => [] as string[]);
      const indexes = seeds.map(() => [] as number[]);
      const subscriptions = seeds.map((seed, i) =>
        subscribeWithDemand(remote.generate(generateRequest({ prompt: 'The stage', max_tokens: 120, temperature: 0.9, seed })), {
          next: (token) => {
            texts[i] += token.text;
            indexes[i]!.push(token.index);
          },
          error: (error: unknown) => ends[i]!.push(`error: ${String(error)}`),
          complete: () => ends[i]!.push('complete'),
        }),
      );
      // A slow consumer: one token per 10 ms each, so the kill lands mid-generation.
      const pacing = setInterval(() => {
        for (const subscription of subscriptions) subscription.request(1);
      }, 10);
      const started = Date.now();
      while (texts.some((text) => text.length < 10) && Date.now() - started < 10_000) await sleep(10);
      a.kill('SIGKILL');
      b = await startWorker(server.url, name, models, events);
      const deadline = Date.now() + 30_000;
      while (ends.some((end) => end.length === 0) && Date.now() < deadline) {
        for (const subscription of subscriptions) subscription.request(50);
        await sleep(50);
      }
      clearInterval(pacing);
      for (let i = 0; i < seeds.length; i++) {
        assert.deepEqual(ends[i], ['complete'], `request ${i} ended once`);
        assert.equal(texts[i], expected[i], `request ${i}: the same text as one uninterrupted generation`);
        assert.deepEqual(
          indexes[i],
          indexes[i]!.map((_, k) => k),
          `request ${i}: each token once, in order`,
        );
      }
      // The survivor logs a request just after sending its end: wait for the line.
      const logged = Date.now() + 5_000;
      while (!events.some((event) => event.attempt >= 2) && Date.now() < logged) await sleep(20);
      assert.ok(
        events.some((event) => event.attempt >= 2),
        'a request was taken over (delivered a second time)',
      );
    } finally {
      a.kill('SIGKILL');
      b?.kill('SIGTERM');
    }
  });
});
