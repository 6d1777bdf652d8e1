/**
 * A worker process for the remote-generation tests: serves the character LM generated into
 * `<models>` to the requesters of link `<name>` on `<url>`, and says "ready" on stdout.
 * Usage: node --conditions=sluice-source --import tsx model-worker.ts <url> <name> <models> [ackWait]
 */
import { join } from 'node:path';
import { connect } from '@nats-io/transport-node';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { CharLmWorker } from '../../src/ai/inference/onnx-lm.js';
import { openModelLink, serveModel } from '../../src/nats.js';

const [url, name, models, ackWait] = process.argv.slice(2) as [string, string, string, string | undefined];
const connection = await connect({ servers: url });
const link = await openModelLink(connection, { name, capacity: 16, ackWait: Number(ackWait ?? 2_000), creditInterval: 50 });
const lm = await CharLmWorker.load(join(models, MODEL_FILES.charLm));
serveModel(link, lm, {
  concurrency: 4,
  onRequest: (event) => process.stdout.write(`${JSON.stringify(event)}\n`),
});
process.stdout.write('ready\n');
process.once('SIGTERM', () => void connection.close().then(() => process.exit(0)));
