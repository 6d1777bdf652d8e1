/**
 * The two sides of `sluice serve --nats` wired for a process: `startModelWorker` is what
 * `sluice worker` runs (the character LM generated from code, served to a link's requesters), and
 * `connectRemoteModel` is the language model `sluice serve --nats` hands its edge.
 */
import { availableParallelism } from 'node:os';
import type { NatsConnection } from '@nats-io/nats-core';
import { natsTransport } from '../core/peers.js';
import { SluiceError, errorMessage } from '../core/errors.js';
import { CharLmWorker } from '../ai/inference/onnx-lm.js';
import type { Completion, GenerateRequest, ModelWorker } from '../ai/inference/worker.js';
import { MODEL_FILES, generateModels } from '../ai/models/generate.js';
import { InferencePool } from '../ai/pool/pool.js';
import { BUNDLED_DATA } from '../ai/models/bundled.js';
import { type ModelServer, serveModel } from './model-server.js';
import { openModelLink } from './remote-protocol.js';
import { remoteModel } from './remote-model.js';

/** The link generation requests go through: named after the model. */
export const MODEL_LINK = 'charlm';
/** Both sides open the link alike; 5 s: a dead worker's requests are resumed by another within it (keep-alives every 2.5 s). */
const LINK = { name: MODEL_LINK, capacity: 256, ackWait: 5_000 } as const;

export interface ModelWorkerOptions {
  /** NATS server URL(s), comma-separated. */
  readonly nats: string;
  /** Folder of the model files; missing ones are generated. Default `models`. */
  readonly models?: string;
  /** Requests this process generates at once. Default 4. */
  readonly concurrency?: number;
  /** Inference worker threads. Default `min(cores, 2)`. */
  readonly poolSize?: number;
  /** Decode steps of its concurrent generations run as one model call, at most; 1 runs each alone. Default 16. */
  readonly maxBatch?: number;
  readonly log?: (line: string) => void;
}

export interface RunningModelWorker {
  readonly server: ModelServer;
  /** Hands the requests in flight back to the link (another worker resumes them), then closes. */
  stop(): Promise<void>;
}

/** Connects to NATS and serves the character LM to the requesters of the `charlm` link. */
export async function startModelWorker(options: ModelWorkerOptions): Promise<RunningModelWorker> {
  const log = options.log ?? (() => {});
  const dir = options.models ?? 'models';
  if (BUNDLED_DATA === undefined) throw new Error('the bundled data/ folder is missing from the package');
  const connection = await connectTo(options.nats, 'worker');
  await generateModels({ outDir: dir, dataDir: BUNDLED_DATA });
  const size = options.poolSize ?? Math.min(availableParallelism(), 2);
  const pool = await InferencePool.create({ name: 'worker', models: { charlm: `${dir}/${MODEL_FILES.charLm}` }, size });
  const link = await openModelLink(connection, LINK);
  const maxBatch = options.maxBatch ?? 16;
  const lm = await CharLmWorker.load(`${dir}/${MODEL_FILES.charLm}`, {
    run: (feeds, signal) => pool.run(feeds, { model: 'charlm', signal }),
    // The generations this worker runs at once share model calls, as the server's do.
    ...(maxBatch > 1 && { batch: { maxBatch, concurrency: size } }),
  });
  const server = serveModel(link, lm, {
    concurrency: options.concurrency ?? 4,
    onRequest: (event) => log(`request ${event.id}: ${event.outcome} after ${event.sent} tokens (delivery ${event.attempt})`),
  });
  log(`serving ${lm.name} on link ${MODEL_LINK} of ${options.nats}`);
  return {
    server,
    stop: async () => {
      server.stop();
      await connection.drain();
      await lm.release();
      await pool.close();
    },
  };
}

/** The language model `sluice serve --nats` serves: generations run on the workers of the `charlm` link. */
export async function connectRemoteModel(nats: string): Promise<{ model: ModelWorker<GenerateRequest, Completion>; close(): Promise<void> }> {
  const connection = await connectTo(nats, 'serve');
  const link = await openModelLink(connection, LINK);
  return { model: remoteModel(link, { name: MODEL_LINK }), close: () => connection.drain() };
}

/** A connection that keeps reconnecting once made (a server restart must not end a worker); an unreachable server fails at once. */
async function connectTo(servers: string, name: string): Promise<NatsConnection> {
  try {
    return await natsTransport().connect({ servers: servers.split(','), name: `sluice-${name}`, maxReconnectAttempts: -1, reconnectTimeWait: 500 });
  } catch (error) {
    throw new SluiceError('NATS_UNREACHABLE', `cannot reach the NATS server at ${servers} (${errorMessage(error)}).`, {
      hint: 'Start nats-server with -js there, or check --nats.',
      cause: error,
    });
  }
}
