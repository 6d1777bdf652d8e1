/**
 * A stage worker process for the crash tests: takes numbers from link `<in>`, doubles each after
 * `<workMs>` ms of async work, and sends the result to link `<out>`. Prints "ready", then one line
 * per message it got on a second or later delivery ("redelivered <seq>"). `--poison=n` kills the
 * process (SIGKILL) whenever n is worked on; `--max-deliver` is the input link's (default 5),
 * `--max-batch` its pulls' (default 8), `--concurrency` the stage's (default 4), `--replicas` both
 * links'. `<urls>` may list several servers, comma-separated. A link that fails ends the process (1).
 * Usage: node --conditions=sluice-source --import tsx stage-worker.ts <urls> <in> <out> <workMs> [--poison=n] ...
 */
import { parseArgs } from 'node:util';
import { connect } from '@nats-io/transport-node';
import { stage } from '../../src/index.js';
import { fromLink, linkMessageOf, openLink, toLink } from '../../src/nats.js';

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: {
    poison: { type: 'string' },
    'max-deliver': { type: 'string', default: '5' },
    'max-batch': { type: 'string', default: '8' },
    concurrency: { type: 'string', default: '4' },
    replicas: { type: 'string', default: '1' },
  },
});
const [urls, input, output, workMs] = positionals as [string, string, string, string];
const replicas = Number(values.replicas) as 1 | 3 | 5;
const poison = values.poison === undefined ? undefined : Number(values.poison);
// Reconnects for as long as it runs: the chaos tests restart the server under it.
const connection = await connect({ servers: urls.split(','), maxReconnectAttempts: -1, reconnectTimeWait: 100 });
const from = await openLink(connection, { name: input, capacity: 64, ackWait: 1_500, creditInterval: 50, maxDeliver: Number(values['max-deliver']), replicas });
const to = await openLink(connection, { name: output, capacity: 1_000, ackWait: 1_500, creditInterval: 50, replicas });
toLink(
  fromLink<number>(from, { maxBatch: Number(values['max-batch']) }).pipe(
    stage(
      async (value: number, context) => {
        const deliveries = linkMessageOf(context)?.deliveries ?? 1;
        if (deliveries > 1) process.stdout.write(`redelivered ${value}\n`);
        if (value === poison) process.kill(process.pid, 'SIGKILL');
        await new Promise((resolve) => setTimeout(resolve, Number(workMs)));
        return value * 2;
      },
      { concurrency: Number(values.concurrency) },
    ),
  ),
  to,
  { producerId: `worker-${process.pid}` },
).catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
process.stdout.write('ready\n');
