import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';
import { lastValueFrom, take, toArray } from 'rxjs';
import { fromIterable, stage, InvalidOptionsError } from '../src/index.js';
import { fromLink, openLink, toLink, LinkError, type LinkMessage } from '../src/nats.js';
import { startNatsServer, type NatsServer } from './support/nats-server.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('sluice/nats links, on a real nats-server', () => {
  let server: NatsServer;
  let nc: NatsConnection;
  before(async () => {
    server = await startNatsServer();
    nc = await connect({ servers: server.url });
  });
  after(async () => {
    await nc?.close();
    await server?.close();
  });

  it('refuses contradictory options at once, naming each bad field', async () => {
    await assert.rejects(openLink(nc, { name: 'bad', capacity: 0, ackWait: 0 }), (error: unknown) => {
      assert.ok(error instanceof InvalidOptionsError);
      const paths = error.issues.map((issue) => issue.path).sort();
      assert.deepEqual(paths, ['ackWait', 'capacity']);
      return true;
    });
    await assert.rejects(openLink(nc, { name: 'has a space' }), InvalidOptionsError);
  });

  it('refuses to reopen a link with another capacity (LINK_CONFLICT)', async () => {
    await openLink(nc, { name: 'conflict', capacity: 8 });
    await assert.rejects(
      openLink(nc, { name: 'conflict', capacity: 16 }),
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
    const link = await openLink(nc, { name: 'slow', capacity, creditInterval: 50 });
    const total = 120;
    let peakSeen = 0;
    const watching = setInterval(() => {
      link.jsm.streams.info(link.stream).then(
        (info) => (peakSeen = Math.max(peakSeen, info.state.messages)),
        () => {},
      );
    }, 5);
    const producing = toLink(fromIterable(Array.from({ length: total }, (_, i) => i)), link, { producerId: 'p1' });
    const received = await lastValueFrom(
      fromLink<number>(link, { maxBatch: 4 }).pipe(
        stage(
          async (message: LinkMessage<number>) => {
            await sleep(2); // slower than the producer
            message.ack();
            return message.value;
          },
          { capacity: 2 },
        ),
        take(total),
        toArray(),
      ),
    );
    clearInterval(watching);
    const summary = await producing;
    assert.equal(summary.published, total);
    assert.equal(summary.duplicates, 0);
    assert.deepEqual(
      received.map((t) => t.value).sort((a, b) => a - b),
      Array.from({ length: total }, (_, i) => i),
    );
    assert.ok(peakSeen <= capacity, `backlog reached ${peakSeen}, capacity ${capacity}`);
    assert.ok(summary.peakBacklog <= capacity);
    assert.ok(peakSeen >= capacity / 2, `the producer kept the link busy (peak ${peakSeen})`);
    const info = await link.jsm.streams.info(link.stream);
    assert.equal(info.state.messages, 0, 'every message acknowledged');
  });

  it('a receiver that leaves gives its unhandled messages back at once, not after ackWait', async () => {
    const link = await openLink(nc, { name: 'leave', capacity: 32, ackWait: 30_000 });
    await toLink(fromIterable(Array.from({ length: 20 }, (_, i) => i)), link, { producerId: 'p1' });
    // A plain subscriber asks for everything: one pull fetches a batch, and `take(3)` leaves with the rest unhandled.
    const first = await lastValueFrom(fromLink<number>(link, { maxBatch: 16 }).pipe(take(3), toArray()));
    for (const message of first) message.ack();
    const started = Date.now();
    const rest = await lastValueFrom(fromLink<number>(link, { maxBatch: 16 }).pipe(take(17), toArray()));
    for (const message of rest) message.ack();
    assert.ok(Date.now() - started < 5_000, `the rest came back in ${Date.now() - started} ms`);
    assert.deepEqual(
      [...first, ...rest].map((m) => m.value).sort((a, b) => a - b),
      Array.from({ length: 20 }, (_, i) => i),
    );
    assert.ok(
      rest.some((m) => m.deliveries === 2),
      "the nak'ed messages were delivered a second time",
    );
  });
});
