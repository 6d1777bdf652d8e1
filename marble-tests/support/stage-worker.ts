/**
 * A stage worker process for the crash tests: takes numbers from link `<in>`, doubles each after
 * `<workMs>` ms of async work, and sends the result to link `<out>`. Prints "ready", then one line
 * per message it got on a second or later delivery ("redelivered <seq>").
 * Usage: node --conditions=sluice-source --import tsx stage-worker.ts <urls> <in> <out> <workMs> [replicas]
 * (`urls` comma-separated: a cluster's nodes).
 */
import { connect } from '@nats-io/transport-node';
import { stage } from '../../src/index.js';
import { fromLink, linkMessageOf, openLink, toLink } from '../../src/nats.js';

const [urls, input, output, workMs, replicas = '1'] = process.argv.slice(2) as [string, string, string, string, string?];
const connection = await connect({ servers: urls.split(','), reconnectTimeWait: 100, maxReconnectAttempts: -1 });
const copies = Number(replicas) as 1 | 3;
const from = await openLink(connection, { name: input, capacity: 64, ackWait: 1_500, creditInterval: 50, replicas: copies });
const to = await openLink(connection, { name: output, capacity: 1_000, creditInterval: 50, replicas: copies });
void toLink(
  fromLink<number>(from, { maxBatch: 8 }).pipe(
    stage(
      async (value: number, context) => {
        const deliveries = linkMessageOf(context)?.deliveries ?? 1;
        if (deliveries > 1) process.stdout.write(`redelivered ${value}\n`);
        await new Promise((resolve) => setTimeout(resolve, Number(workMs)));
        return value * 2;
      },
      { concurrency: 4 },
    ),
  ),
  to,
  { producerId: `worker-${process.pid}` },
);
process.stdout.write('ready\n');
