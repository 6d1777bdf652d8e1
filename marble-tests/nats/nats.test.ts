import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import { Observable, VirtualTimeScheduler, filter, lastValueFrom, take, toArray } from 'rxjs';
import { PipelineGraph } from '../../src/serve/inspect/pipeline-graph.js';
import { eventually } from '../../src/testing/index.js';
import * as z from 'zod';
import { admission, fromIterable, stage, untraced, InvalidOptionsError, type Traced } from '../../src/index.js';
import { checkLink, fromLink, linkMessageOf, openLink, toLink, LinkError, LinkReceiverStats } from '../../src/nats.js';
import { natsServerFixture, startNatsServer } from '../support/nats-server.js';
import { startScript } from '../support/child-script.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The link stream's message count once acknowledgements in flight reached the server: polls up to `ms` (3 s) for it to drain to 0 (acks are not confirmed). */
async function settledCount(
  link: { jsm: { streams: { info(name: string): Promise<{ state: { messages: number } }> } }; stream: string },
  ms = 3_000,
): Promise<number> {
  let left = (await link.jsm.streams.info(link.stream)).state.messages;
  for (let i = 0; i < ms / 20 && left !== 0; i++) {
    await sleep(20);
    left = (await link.jsm.streams.info(link.stream)).state.messages;
  }
  return left;
}

/** What depends on round trips to the server is waited for in 5 ms steps, not event-loop turns (at most 10 s): a loaded machine takes longer than 100 turns. */
const SERVER_ROUND_TRIPS = { maxTicks: 2000, tick: () => new Promise<void>((resolve) => setTimeout(resolve, 5)) };

describe('sluice/nats links, on a real nats-server', () => {
  const fixture = natsServerFixture();

  it('refuses contradictory options at once, naming each bad field', async () => {
    await assert.rejects(openLink(fixture.nc, { name: 'bad', capacity: 0, ackWait: 0 }), (error: unknown) => {
      assert.ok(error instanceof InvalidOptionsError);
      const paths = error.issues.map((issue) => issue.path).sort();
      assert.deepEqual(paths, ['ackWait', 'capacity']);
      return true;
    });
    await assert.rejects(openLink(fixture.nc, { name: 'has a space' }), InvalidOptionsError);
    await assert.rejects(
      openLink(fixture.nc, { name: 'two', replicas: 2 as 3 }),
      (error: unknown) => error instanceof InvalidOptionsError && /replicas must be 1, 3 or 5/.test(error.message),
    );
    // Three copies on a server that is not part of a cluster: the server refuses, and the error says which stream.
    await assert.rejects(
      openLink(fixture.nc, { name: 'replicated', replicas: 3 }),
      (error: unknown) => error instanceof LinkError && error.code === 'LINK_REFUSED' && /SLUICE_replicated/.test(error.message),
    );
  });

  it('fromLink refuses bad options when it is called, naming each field, before anything is pulled', async () => {
    // Checked before the link is touched: no server is needed.
    const link = {} as Parameters<typeof fromLink>[0];
    try {
      fromLink(link, { maxBatch: 0, onShed: 'drop' as 'nak', maxHold: -1, stats: {} as LinkReceiverStats, batch: 2 } as never);
      assert.fail('expected InvalidOptionsError');
    } catch (error) {
      assert.ok(error instanceof InvalidOptionsError, String(error));
      assert.deepEqual(error.issues.map((issue) => issue.path).sort(), ['batch', 'maxBatch', 'maxHold', 'onShed', 'stats']);
    }
    assert.doesNotThrow(() => fromLink(link, { maxBatch: 8, onShed: 'nak', keepAlive: false }));
  });

  it('toLink refuses bad options when it is called, naming each field, before anything is published', () => {
    // Checked before the link is touched: no server is needed.
    const link = {} as Parameters<typeof toLink>[1];
    try {
      void toLink(fromIterable([1]), link, { producerId: '', ids: 'random', onInvalid: 'drop', encode: 'json', producer: 'p' } as never);
      assert.fail('expected InvalidOptionsError');
    } catch (error) {
      assert.ok(error instanceof InvalidOptionsError, String(error));
      assert.deepEqual(error.issues.map((issue) => issue.path).sort(), ['encode', 'ids', 'onInvalid', 'producer', 'producerId']);
    }
  });

  it('refuses to reopen a link with another capacity (LINK_CONFLICT)', async () => {
    await openLink(fixture.nc, { name: 'conflict', capacity: 8 });
    await assert.rejects(
      openLink(fixture.nc, { name: 'conflict', capacity: 16 }),
      (error: unknown) => error instanceof LinkError && error.code === 'LINK_CONFLICT' && /max_msgs 8/.test(error.message),
    );
  });

  it('names JetStream when the server has none (JETSTREAM_UNAVAILABLE)', async () => {
    const plain = await startNatsServer({ jetstream: false });
    const connection = await connect({ servers: plain.url });
    try {
      await assert.rejects(openLink(connection, { name: 'nojs' }), (error: unknown) => error instanceof LinkError && error.code === 'JETSTREAM_UNAVAILABLE');
    } finally {
      await connection.close();
      await plain.close();
    }
  });

  it('a slow receiver pauses the producer: the backlog stays within capacity and nothing is lost or repeated', async () => {
    const capacity = 8;
    const link = await openLink(fixture.nc, { name: 'slow', capacity, creditInterval: 50 });
    const total = 120;
    let peakSeen = 0;
    let peakHeld = 0;
    const stats = new LinkReceiverStats();
    const watching = setInterval(() => {
      link.jsm.streams.info(link.stream).then(
        (info) => (peakSeen = Math.max(peakSeen, info.state.messages)),
        () => {},
      );
    }, 5);
    const holding = setInterval(() => (peakHeld = Math.max(peakHeld, stats.held)), 1);
    const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), link, { producerId: 'p1' });
    const received = await lastValueFrom(
      fromLink<number>(link, { maxBatch: 4, stats }).pipe(
        stage(
          async (value: number) => {
            await sleep(2); // slower than the producer
            return value;
          },
          { capacity: 2 },
        ),
        untraced(),
        take(total),
        toArray(),
      ),
    );
    clearInterval(watching);
    clearInterval(holding);
    const summary = await producing;
    // The receiver holds no more than its pipeline asked for: the stage's buffer and the one in its work.
    assert.ok(peakHeld <= 2 + 1, `the receiver held ${peakHeld} messages at once`);
    assert.ok(peakHeld >= 2, `the receiver kept its pipeline fed (${peakHeld})`);
    assert.equal(summary.published, total);
    assert.equal(summary.duplicates, 0);
    assert.deepEqual(
      received.sort((a, b) => a - b),
      Array.from({ length: total }, (_, i) => i),
    );
    assert.ok(peakSeen <= capacity, `backlog reached ${peakSeen}, capacity ${capacity}`);
    assert.ok(summary.peakBacklog <= capacity);
    assert.ok(peakSeen >= capacity / 2, `the producer kept the link busy (peak ${peakSeen})`);
    // The last ack is on its way when take() completes: wait for the server to have it.
    assert.equal(await settledCount(link), 0, 'every message acknowledged');
  });

  it('an inspector draws a link as its publisher and receiver nodes, between the stages on either side', async () => {
    const graph = new PipelineGraph({ scheduler: new VirtualTimeScheduler() }).start();
    try {
      const link = await openLink(fixture.nc, { name: 'inspected', capacity: 8, creditInterval: 50 });
      const total = 30;
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)).pipe(stage((n: number) => n, { name: 'before-link' })), link);
      const receiving = lastValueFrom(
        fromLink<number>(link, { maxBatch: 4 }).pipe(
          stage(
            async (n: number) => {
              await gate;
              return n;
            },
            { name: 'after-link', capacity: 2 },
          ),
          untraced(),
          take(total),
          toArray(),
        ),
      );
      await eventually(() => {
        const live = graph.snapshot();
        const id = (kind: string, name: string) => live.nodes.find((n) => n.kind === kind && n.name === name)?.id;
        const edges = new Set(live.edges.map((e) => `${e.from}->${e.to}`));
        assert.ok(edges.has(`${id('stage', 'before-link')}->${id('nats-publish', 'inspected')}`), JSON.stringify(live.edges));
        assert.ok(edges.has(`${id('nats-publish', 'inspected')}->${id('nats-receive', 'inspected')}`), JSON.stringify(live.edges));
        assert.ok(edges.has(`${id('nats-receive', 'inspected')}->${id('stage', 'after-link')}`), JSON.stringify(live.edges));
        const receiver = live.nodes.find((n) => n.kind === 'nats-receive')!;
        assert.ok(receiver.inFlight >= 1, 'messages emitted and not yet acknowledged');
        assert.equal(receiver.unaccounted, 0);
      }, SERVER_ROUND_TRIPS);
      open();
      assert.equal((await receiving).length, total);
      await producing;
    } finally {
      graph.stop();
    }
  });

  it('a receiver that leaves while its pull is still arriving gives those messages back too, not after ackWait', async () => {
    const link = await openLink(fixture.nc, { name: 'leave-midway', capacity: 32, ackWait: 30_000 });
    // Large messages arrive over many reads: the consumer below leaves while most of its pull is still on the wire.
    const body = 'x'.repeat(60_000);
    await toLink(fromIterable(Array.from({ length: 16 }, (_, i) => `${i}:${body}`)), link, { producerId: 'p1' });
    const first = await lastValueFrom(fromLink<string>(link, { maxBatch: 16 }).pipe(untraced(), take(1), toArray()));
    const started = Date.now();
    const rest = await lastValueFrom(fromLink<string>(link, { maxBatch: 16 }).pipe(untraced(), take(15), toArray()));
    assert.ok(Date.now() - started < 5_000, `the rest came back in ${Date.now() - started} ms`);
    assert.deepEqual(
      [...first, ...rest].map((value) => Number(value.split(':')[0])).sort((a, b) => a - b),
      Array.from({ length: 16 }, (_, i) => i),
    );
  });

  it('a receiver that leaves gives its unhandled messages back at once, not after ackWait', async () => {
    const link = await openLink(fixture.nc, { name: 'leave', capacity: 32, ackWait: 30_000 });
    await toLink(fromIterable(Array.from({ length: 20 }, (_, i) => i)), link, { producerId: 'p1' });
    // A plain subscriber asks for everything: one pull fetches a batch, and `take(3)` leaves with the rest unhandled.
    const first = await lastValueFrom(fromLink<number>(link, { maxBatch: 16 }).pipe(untraced(), take(3), toArray()));
    const started = Date.now();
    const deliveries: number[] = [];
    const rest = await lastValueFrom(
      fromLink<number>(link, { maxBatch: 16 }).pipe(
        stage((value: number, context) => {
          deliveries.push(linkMessageOf(context)!.deliveries);
          return value;
        }),
        untraced(),
        take(17),
        toArray(),
      ),
    );
    assert.ok(Date.now() - started < 5_000, `the rest came back in ${Date.now() - started} ms`);
    assert.deepEqual(
      [...first, ...rest].sort((a, b) => a - b),
      Array.from({ length: 20 }, (_, i) => i),
      'the three taken were acknowledged, the rest given back: each value once',
    );
    assert.ok(deliveries.includes(2), "the nak'ed messages were delivered a second time");
    assert.equal(await settledCount(link), 0);
  });

  it('acknowledges a message only once the pipeline is done with it: not while a stage works on it', async () => {
    const link = await openLink(fixture.nc, { name: 'after', capacity: 16 });
    await toLink(fromIterable([1, 2, 3, 4]), link, { producerId: 'p1' });
    const stats = new LinkReceiverStats();
    const pendingDuringWork: number[] = [];
    const ackedDuringWork: number[] = [];
    const values = await lastValueFrom(
      fromLink<number>(link, { stats }).pipe(
        stage(async (value: number) => {
          const consumer = await link.jsm.consumers.info(link.stream, link.durable);
          pendingDuringWork.push(consumer.num_ack_pending);
          ackedDuringWork.push(stats.acked);
          return value * 10;
        }),
        stage(async (value: number) => value + 1),
        untraced(),
        take(4),
        toArray(),
      ),
    );
    assert.deepEqual(values, [11, 21, 31, 41]);
    assert.ok(
      pendingDuringWork.every((n) => n >= 1),
      `each element's message was unacknowledged while a stage held it (${pendingDuringWork})`,
    );
    // Work is serial (concurrency 1): the k-th element's work sees at most the k−1 before it acknowledged.
    ackedDuringWork.forEach((acked, k) => assert.ok(acked <= k, `element ${k} saw ${acked} acknowledged`));
    assert.equal(await settledCount(link), 0);
    assert.equal(stats.acked, 4);
  });

  it('a streaming stage: the message is acknowledged after its last output was taken, not its first', async () => {
    const link = await openLink(fixture.nc, { name: 'streaming', capacity: 4 });
    await toLink(fromIterable(['abc']), link, { producerId: 'p1' });
    const stats = new LinkReceiverStats();
    const ackedAtEachToken: number[] = [];
    const tokens = await lastValueFrom(
      fromLink<string>(link, { stats }).pipe(
        stage(
          (word: string) =>
            new Observable<string>((subscriber) => {
              let i = 0;
              const timer = setInterval(() => {
                if (i < word.length) subscriber.next(word[i++]!);
                else subscriber.complete();
              }, 5);
              return () => clearInterval(timer);
            }),
        ),
        stage(async (token: string) => {
          await sleep(5);
          ackedAtEachToken.push(stats.acked);
          return token.toUpperCase();
        }),
        untraced(),
        take(3),
        toArray(),
      ),
    );
    assert.deepEqual(tokens, ['A', 'B', 'C']);
    assert.deepEqual(ackedAtEachToken, [0, 0, 0], 'nothing acknowledged while tokens were still on their way');
    await sleep(20);
    assert.equal(stats.acked, 1);
    assert.equal(stats.nacked, 0);
  });

  it('a failed element is dead-lettered with its reason and terminated: never delivered again', async () => {
    const link = await openLink(fixture.nc, { name: 'failing', capacity: 16, ackWait: 1_000 });
    await toLink(fromIterable([1, 2, 3, 4, 5]), link, { producerId: 'p1' });
    const stats = new LinkReceiverStats();
    const dead: { seq: number; reason: string }[] = [];
    const values = await lastValueFrom(
      fromLink<number>(link, { stats, onDeadLetter: (event) => dead.push(event) }).pipe(
        stage(
          (value: number) => {
            if (value === 3) throw new Error('three is not allowed');
            return value;
          },
          { errorPolicy: 'skip' },
        ),
        untraced(),
        take(4),
        toArray(),
      ),
    );
    assert.deepEqual(values, [1, 2, 4, 5]);
    await sleep(1_500); // past ackWait: a message left unsettled would be delivered again by now
    assert.equal(dead.length, 1);
    assert.match(dead[0]!.reason, /three is not allowed/);
    assert.equal(stats.deadLettered, 1);
    assert.equal(stats.redelivered, 0);
    const letters = await link.jsm.streams.info(link.deadStream);
    assert.equal(letters.state.messages, 1);
    const letter = await link.jsm.streams.getMessage(link.deadStream, { seq: letters.state.first_seq });
    assert.equal(new TextDecoder().decode(letter!.data), '3');
    assert.match(letter!.header.get('sluice-reason'), /WORK_FAILED.*three is not allowed/);
    const remaining = (await link.jsm.streams.info(link.stream)).state.messages;
    assert.equal(remaining, 0);
    assert.equal(5, stats.acked + stats.deadLettered + remaining, 'published = acknowledged + dead-lettered + in the stream');
  });

  it("an inspector lists a link's recent dead letters one by one — subject, seq, code, deliveries — never the body or the reason's text, and keeps a bounded number", async () => {
    const graph = new PipelineGraph({ deadLetters: 2 }).start();
    try {
      const link = await openLink(fixture.nc, { name: 'inspected-dead', capacity: 16 });
      await toLink(fromIterable([1, 2, 3, 4, 5]), link, { producerId: 'p1' });
      await link.js.publish(link.subject, 'not json, secret prompt text');
      await toLink(fromIterable([7]), link, { producerId: 'p2' });
      const values = await lastValueFrom(
        fromLink<number>(link).pipe(
          stage(
            (value: number) => {
              if (value % 2 === 0) throw new TypeError(`even value ${value}, secret prompt text`);
              return value;
            },
            { name: 'odd-only', errorPolicy: 'skip' },
          ),
          untraced(),
          take(4),
          toArray(),
        ),
      );
      assert.deepEqual(values, [1, 3, 5, 7]);
      await eventually(
        () => assert.equal(graph.snapshot().nodes.find((n) => n.kind === 'nats-receive')!.failed, 3, 'three dead letters counted'),
        SERVER_ROUND_TRIPS,
      );
      const snapshot = graph.snapshot();
      const letters = snapshot.deadLetters;
      // Three dead letters (values 2 and 4, the bad body): the oldest is dropped, the last two kept, newest last.
      assert.equal(letters.length, 2);
      assert.deepEqual(
        letters.map((l) => [l.link, l.subject, l.seq, l.code, l.deliveries]),
        [
          ['inspected-dead', link.subject, 4, 'WORK_FAILED', 1],
          ['inspected-dead', link.subject, 6, 'INVALID_MESSAGE', 1],
        ],
      );
      assert.ok(letters.every((l) => l.node === snapshot.nodes.find((n) => n.kind === 'nats-receive')!.id));
      assert.ok(!JSON.stringify(snapshot).includes('secret prompt'), 'neither the body nor the reason text');
    } finally {
      graph.stop();
    }
  });

  it('a message the link schema refuses is dead-lettered with the path of the bad field; a producer refuses to send one', async () => {
    const schema = z.object({ prompt: z.string(), maxTokens: z.number().int() });
    const link = await openLink(fixture.nc, { name: 'typed', capacity: 16, schema });
    await toLink(fromIterable([{ prompt: 'a', maxTokens: 1 }]), link, { producerId: 'p1' });
    // A producer that does not use sluice sends a bad body.
    await link.js.publish(link.subject, JSON.stringify({ prompt: 'b', maxTokens: 'many' }));
    await link.js.publish(link.subject, 'not json');
    await toLink(fromIterable([{ prompt: 'c', maxTokens: 3 }]), link, { producerId: 'p2' });
    const dead: string[] = [];
    const values = await lastValueFrom(fromLink(link, { onDeadLetter: (event) => dead.push(event.reason) }).pipe(untraced(), take(2), toArray()));
    assert.deepEqual(
      values.map((v) => v.prompt),
      ['a', 'c'],
    );
    await sleep(50);
    assert.equal(dead.length, 2);
    assert.ok(
      dead.some((reason) => /maxTokens/.test(reason)),
      dead.join(' | '),
    );
    assert.ok(
      dead.some((reason) => /undecodable/.test(reason)),
      dead.join(' | '),
    );
    await assert.rejects(
      toLink(fromIterable([{ prompt: 'd', maxTokens: 1.5 }]), link, { producerId: 'p3' }),
      (error: unknown) => error instanceof LinkError && error.code === 'INVALID_MESSAGE' && /maxTokens/.test(error.message),
    );
  });

  it('a shed element is acknowledged (counted as shed), not left to time out', async () => {
    const link = await openLink(fixture.nc, { name: 'shedding', capacity: 32, ackWait: 3_000 });
    await toLink(fromIterable(Array.from({ length: 10 }, (_, i) => i)), link, { producerId: 'p1' });
    const stats = new LinkReceiverStats();
    const admitted: number[] = [];
    const subscription = fromLink<number>(link, { stats, maxBatch: 10 })
      .pipe(admission<number>({ rate: { perTenant: 1, burst: 2 }, tenant: () => 'one', maxQueue: 1 }), untraced())
      .subscribe((value) => admitted.push(value));
    await sleep(1_500);
    subscription.unsubscribe();
    await sleep(50);
    assert.ok(admitted.length >= 2, `admitted ${admitted}`);
    assert.equal(stats.redelivered, 0, 'nothing timed out and came back');
    assert.equal(stats.acked + stats.nacked, 10);
    assert.ok(stats.acked >= 9 - 1, `the shed ones were acknowledged (${stats.acked} acked, ${stats.nacked} given back)`);
  });

  it("a worker's hop: input acknowledged once its output is stored on the next link, with the trace carried across", async () => {
    const requests = await openLink(fixture.nc, { name: 'requests', capacity: 8 });
    const answers = await openLink(fixture.nc, { name: 'answers', capacity: 8 });
    const sent: Traced<string>[] = [];
    const producing = toLink(
      fromIterable(['x', 'y', 'z']).pipe(
        stage((value: string) => value, { name: 'ingest', sampleRate: 1 }),
        (source) =>
          new Observable<Traced<string>>((subscriber) =>
            source.subscribe({
              next: (element) => {
                sent.push(element);
                subscriber.next(element);
              },
              complete: () => subscriber.complete(),
            }),
          ),
      ),
      requests,
      { producerId: 'edge' },
    );
    const requestStats = new LinkReceiverStats();
    const working = toLink(
      fromLink<string>(requests, { stats: requestStats }).pipe(
        stage(async (value: string) => value.toUpperCase(), { name: 'work' }),
        take(3),
      ),
      answers,
      { producerId: 'worker' },
    );
    await producing;
    const workSummary = await working;
    assert.equal(workSummary.published, 3);
    await sleep(20);
    assert.equal(requestStats.acked, 3, 'each request acknowledged once its answer was stored');
    const received = await lastValueFrom(fromLink<string>(answers).pipe(take(3), toArray()));
    assert.deepEqual(
      received.map((element) => element.value),
      ['X', 'Y', 'Z'],
    );
    received.forEach((element, i) => {
      assert.equal(element.trace.traceId, sent[i]!.trace.traceId, 'the trace id crossed two links');
      assert.ok(element.trace.sampled);
      assert.deepEqual(
        element.trace.records?.map((record) => record.stage),
        ['ingest', 'work'],
        'the per-stage records of both processes',
      );
      assert.equal(element.trace.seq, sent[i]!.trace.seq);
    });
  });

  it('nats-server restarted with the same store mid-run: producer and receiver resume, nothing is lost', async () => {
    const own = await startNatsServer();
    const connection = await connect({ servers: own.url, reconnectTimeWait: 100, maxReconnectAttempts: -1 });
    try {
      const link = await openLink(connection, { name: 'restart', capacity: 16, ackWait: 2_000, creditInterval: 50 });
      const total = 150;
      const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), link, { producerId: 'p1' });
      const stats = new LinkReceiverStats();
      const seen: number[] = [];
      let restarted: Promise<void> | undefined;
      let subscription: { unsubscribe(): void } | undefined;
      await new Promise<void>((resolve, reject) => {
        subscription = fromLink<number>(link, { stats, maxBatch: 8 })
          .pipe(
            stage(async (value: number) => {
              await sleep(2);
              return value;
            }),
            untraced(),
          )
          .subscribe({
            next: (value) => {
              seen.push(value);
              if (seen.length === 40) restarted = own.restart();
              if (new Set(seen).size === total) resolve();
            },
            error: reject,
          });
      });
      await restarted;
      const summary = await producing;
      assert.equal(summary.published, total);
      assert.equal(new Set(seen).size, total, 'every element arrived');
      // Still subscribed: a copy whose first ack was lost in the restart comes again (after ackWait) and is acknowledged then.
      assert.equal(await settledCount(link, 8_000), 0, 'every message acknowledged in the end');
      subscription?.unsubscribe();
      assert.equal(seen.length, total, `each element once: ${seen.length - total} seen twice (copies dropped: ${stats.duplicates})`);
    } finally {
      await connection.close();
      await own.close();
    }
  });

  it('a message dropped by a plain operator is delivered again, and after maxDeliver moved to the dead letters, not left in the queue', async () => {
    const link = await openLink(fixture.nc, { name: 'expiring', capacity: 16, ackWait: 1_000, maxDeliver: 2 });
    await toLink(fromIterable(Array.from({ length: 10 }, (_, i) => i)), link, { producerId: 'p1' });
    const dead: string[] = [];
    const seen: number[] = [];
    const subscription = fromLink<number>(link, { keepAlive: false, onDeadLetter: (event) => dead.push(event.reason) })
      .pipe(
        filter((element) => element.value !== 7),
        untraced(),
      )
      .subscribe((value) => seen.push(value));
    const deadline = Date.now() + 10_000;
    while (dead.length === 0 && Date.now() < deadline) await sleep(50);
    subscription.unsubscribe();
    assert.equal(dead.length, 1, 'the dropped message was dead-lettered');
    assert.match(dead[0]!, /not settled while worked on alone once .*plain operator/);
    assert.deepEqual(
      seen.sort((a, b) => a - b),
      [0, 1, 2, 3, 4, 5, 6, 8, 9],
    );
    assert.equal(await settledCount(link), 0, 'nothing left holding a place of the capacity');
    assert.equal((await link.jsm.streams.info(link.deadStream)).state.messages, 1);
  });

  it('keepAlive: work longer than ackWait is not delivered again meanwhile', async () => {
    const link = await openLink(fixture.nc, { name: 'long', capacity: 4, ackWait: 1_000 });
    await toLink(fromIterable([1]), link, { producerId: 'p1' });
    const stats = new LinkReceiverStats();
    const values = await lastValueFrom(
      fromLink<number>(link, { stats }).pipe(
        stage(async (value: number) => {
          await sleep(2_500);
          return value;
        }),
        untraced(),
        take(1),
        toArray(),
      ),
    );
    assert.deepEqual(values, [1]);
    assert.equal(stats.redelivered, 0);
    assert.equal(stats.received, 1);
  });

  it('contracts: a producer whose schema the receivers do not cover is refused before anything is sent; one they cover goes through', async () => {
    const name = 'contract';
    const receiverSide = await openLink(fixture.nc, { name, capacity: 8, schema: z.object({ prompt: z.string(), maxTokens: z.number().int() }) });
    // The receiver records what it accepts when it starts.
    const received: { prompt: string }[] = [];
    const receiving = fromLink(receiverSide)
      .pipe(untraced())
      .subscribe((value) => received.push(value));
    await sleep(100);
    const stale = await openLink(fixture.nc, { name, capacity: 8, schema: z.object({ prompt: z.string() }) });
    await assert.rejects(
      toLink(fromIterable([{ prompt: 'a' }]), stale, { producerId: 'old' }),
      (error: unknown) => error instanceof LinkError && error.code === 'SCHEMA_MISMATCH' && /maxTokens: the receiver requires it/.test(error.message),
    );
    assert.equal((await receiverSide.jsm.streams.info(receiverSide.stream)).state.messages, 0, 'nothing was sent');
    const current = await openLink(fixture.nc, {
      name,
      capacity: 8,
      schema: z.object({ prompt: z.string(), maxTokens: z.number().int().min(1), stream: z.boolean().default(false) }),
    });
    const summary = await toLink(fromIterable([{ prompt: 'b', maxTokens: 4 }]), current, { producerId: 'new' });
    assert.equal(summary.published, 1);
    const deadline = Date.now() + 3_000;
    while (received.length === 0 && Date.now() < deadline) await sleep(20);
    assert.equal(received[0]?.prompt, 'b');
    receiving.unsubscribe();
    // A receiver that would refuse what the recorded producer sends is refused too.
    const narrow = await openLink(fixture.nc, { name, capacity: 8, schema: z.object({ prompt: z.string(), maxTokens: z.number().int().max(2) }) });
    await assert.rejects(
      lastValueFrom(fromLink(narrow)),
      (error: unknown) => error instanceof LinkError && error.code === 'SCHEMA_MISMATCH' && /maxTokens/.test(error.message),
    );
    const report = await checkLink(current);
    assert.deepEqual(report.reasons, []);
    assert.ok(report.producer !== undefined && report.receiver !== undefined);
  });

  it('two stage worker processes share a link; one SIGKILLed under load: nothing lost, its redone results dropped as copies by the server', async () => {
    const input = 'jobs';
    const output = 'results';
    const total = 300;
    const jobs = await openLink(fixture.nc, { name: input, capacity: 64, ackWait: 1_500, creditInterval: 50 });
    const results = await openLink(fixture.nc, { name: output, capacity: 1_000, ackWait: 1_500, creditInterval: 50 });
    const a = await startScript('./stage-worker.ts', [fixture.server.url, input, output, '5']);
    const b = await startScript('./stage-worker.ts', [fixture.server.url, input, output, '5']);
    try {
      const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), jobs, { producerId: 'jobs' });
      const stored = async () => (await results.jsm.streams.info(results.stream)).state.messages;
      let deadline = Date.now() + 20_000;
      while ((await stored()) < 80 && Date.now() < deadline) await sleep(10);
      a.child.kill('SIGKILL');
      await producing;
      deadline = Date.now() + 20_000;
      while ((await stored()) < total && Date.now() < deadline) await sleep(50);
      await sleep(2_000); // past ackWait: anything the dead worker held has been redone by now
      assert.equal(await stored(), total, 'each result stored once');
      assert.equal((await jobs.jsm.streams.info(jobs.stream)).state.messages, 0, 'every job acknowledged');
      const values = await lastValueFrom(fromLink<number>(results).pipe(untraced(), take(total), toArray()));
      assert.deepEqual(
        values.sort((x, y) => x - y),
        Array.from({ length: total }, (_, i) => i * 2),
      );
      assert.ok(
        b.lines.some((line) => line.startsWith('redelivered')),
        'the survivor redid what the dead worker held',
      );
    } finally {
      a.child.kill('SIGKILL');
      b.child.kill('SIGKILL');
    }
  });

  it('a connection closed for good fails a receiver and a producer with LINK_DISCONNECTED, never a silent stall', async () => {
    const connection = await connect({ servers: fixture.server.url });
    const link = await openLink(connection, { name: 'closing', capacity: 4, creditInterval: 50, pullExpires: 1_000 });
    await toLink(fromIterable([1, 2, 3, 4]), link, { producerId: 'p1' });
    // Nothing is settled (no untraced): the link stays full, and the second producer waits for room.
    const receiving = lastValueFrom(fromLink<number>(link, { maxBatch: 1 }).pipe(toArray()));
    const producing = toLink(fromIterable([5, 6]), link, { producerId: 'p2' });
    await sleep(100);
    await connection.close();
    const disconnected = (error: unknown) => error instanceof LinkError && error.code === 'LINK_DISCONNECTED';
    await assert.rejects(receiving, disconnected);
    await assert.rejects(producing, disconnected);
  });

  it('a producer that fills the link exactly, with no receiver running, still resolves; one more waits for room', async () => {
    const link = await openLink(fixture.nc, { name: 'exact', capacity: 4, creditInterval: 50 });
    const summary = await toLink(fromIterable([1, 2, 3, 4]), link, { producerId: 'p1' });
    assert.equal(summary.published, 4);
    let resolved = false;
    const more = toLink(fromIterable([5]), link, { producerId: 'p2' }).then((s) => {
      resolved = true;
      return s;
    });
    await sleep(300);
    assert.equal(resolved, false, 'the fifth waits: the link is full');
    assert.equal((await link.jsm.streams.info(link.stream)).state.messages, 4);
    const first = await lastValueFrom(fromLink<number>(link).pipe(untraced(), take(1), toArray()));
    assert.equal(first.length, 1);
    assert.equal((await more).published, 1);
  });
});
