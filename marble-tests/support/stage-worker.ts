/**
 * A stage worker process for the crash tests: takes numbers from link `<in>`, doubles each after
 * `<workMs>` ms of async work, and sends the result to link `<out>`. Prints "ready", then one line
 * per message it got on a second or later delivery ("redelivered <seq>"). A `<poison>` value kills
 * the process (SIGKILL) whenever it is worked on; `<maxDeliver>` is the input link's (default 5),
 * `<maxBatch>` its pulls' (default 8), `<concurrency>` the stage's (default 4).
 * Usage: node --conditions=sluice-source --import tsx stage-worker.ts <url> <in> <out> <workMs> [poison] [maxDeliver] [maxBatch] [concurrency]
 */
import { connect } from '@nats-io/transport-node';
import { stage } from '../../src/index.js';
import { fromLink, linkMessageOf, openLink, toLink } from '../../src/nats.js';

const [url, input, output, workMs, poison, maxDeliver, maxBatch, concurrency] = process.argv.slice(2) as [
  string,
  string,
  string,
  string,
  ...(string | undefined)[],
];
// Reconnects for as long as it runs: the chaos tests restart the server under it.
const connection = await connect({ servers: url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
const from = await openLink(connection, { name: input, capacity: 64, ackWait: 1_500, creditInterval: 50, maxDeliver: Number(maxDeliver ?? 5) });
const to = await openLink(connection, { name: output, capacity: 1_000, ackWait: 1_500, creditInterval: 50 });
void toLink(
  fromLink<number>(from, { maxBatch: Number(maxBatch ?? 8) }).pipe(
    stage(
      async (value: number, context) => {
        const deliveries = linkMessageOf(context)?.deliveries ?? 1;
        if (deliveries > 1) process.stdout.write(`redelivered ${value}\n`);
        if (poison !== undefined && value === Number(poison)) process.kill(process.pid, 'SIGKILL');
        await new Promise((resolve) => setTimeout(resolve, Number(workMs)));
        return value * 2;
      },
      { concurrency: Number(concurrency ?? 4) },
    ),
  ),
  to,
  { producerId: `worker-${process.pid}` },
);
process.stdout.write('ready\n');
