/**
 * A worker process of the NATS bench (`nats.ts`, section 7): it receives numbers from a link and
 * works on each for `--work-ms` (a timer), `--concurrency` at a time.
 *
 *     node --conditions=sluice-source --import tsx bench/nats-worker.ts <url> <link> <report> \
 *       [--capacity=64] [--ack-wait=30000] [--work-ms=1] [--concurrency=1] [--buffer=2]
 *
 * It prints "ready" on stdout once its receiver is subscribed, and tells the bench process what it
 * does on core NATS: `<report>.took` with the value when its work starts, and `<report>.done` with
 * the value once the element left the pipeline (its message is acknowledged right after). SIGTERM
 * gives back what it holds and exits; SIGKILL leaves it to the link's `ackWait`.
 */
import { parseArgs } from 'node:util';
import { connect } from '@nats-io/transport-node';
import { stage, untraced } from 'sluice';
import { fromLink, openLink } from 'sluice/nats';

const { positionals, values } = parseArgs({
  allowPositionals: true,
  options: {
    capacity: { type: 'string', default: '64' },
    'ack-wait': { type: 'string', default: '30000' },
    'work-ms': { type: 'string', default: '1' },
    concurrency: { type: 'string', default: '1' },
    // The stage's own buffer: small, so a worker does not hold messages another worker could take.
    buffer: { type: 'string', default: '2' },
  },
});
const [url, name, report] = positionals;
if (url === undefined || name === undefined || report === undefined)
  throw new Error('usage: nats-worker.ts <url> <link> <report> [--capacity=n] [--ack-wait=ms] [--work-ms=ms] [--concurrency=n] [--buffer=n]');
const workMs = Number(values['work-ms']);

const connection = await connect({ servers: url });
const link = await openLink<number>(connection, { name, capacity: Number(values.capacity), ackWait: Number(values['ack-wait']) });

async function work(value: number): Promise<number> {
  connection.publish(`${report}.took`, String(value));
  await new Promise((resolve) => setTimeout(resolve, workMs));
  return value;
}

const subscription = fromLink<number>(link)
  .pipe(stage(work, { concurrency: Number(values.concurrency), capacity: Number(values.buffer) }), untraced())
  .subscribe({
    next: (value) => connection.publish(`${report}.done`, String(value)),
    error: (error: unknown) => {
      console.error(error);
      process.exit(1);
    },
  });
process.stdout.write('ready\n');

process.once('SIGTERM', () => {
  subscription.unsubscribe(); // what it holds goes back to the link (nak) at once
  void connection.drain().finally(() => process.exit(0));
});
