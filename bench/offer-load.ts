/**
 * Open-loop load for bench 10, in a worker thread: one streamed completion started every
 * 1/`rate` s for `seconds`, each timed to its response's head and first token. Several such threads
 * share the offered rate, so no one event loop's own delay is what the refusals are timed by.
 */
import { Agent, request as httpRequest } from 'node:http';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import { monotonicMs } from './harness.js';

export interface Outcome {
  readonly status: number;
  /** ms to the response's head. */
  readonly head: number;
  /** ms to the first token (admitted requests). */
  readonly firstToken: number | undefined;
}

/** What one load thread is asked to offer. */
export interface LoadPlan {
  readonly url: string;
  readonly model: string;
  readonly tokens: number;
  /** Requests per second this thread starts. */
  readonly rate: number;
  readonly seconds: number;
}

/** What one load thread saw: every outcome, and its own event loop's delay p99, ms. */
export interface LoadReport {
  readonly outcomes: readonly Outcome[];
  readonly loopDelayP99: number;
}

/** One streamed completion, read to its end. */
export function complete(url: URL, agent: Agent, model: string, tokens: number): Promise<Outcome> {
  const body = JSON.stringify({ model, stream: true, max_tokens: tokens, messages: [{ role: 'user', content: 'The stage' }] });
  const started = monotonicMs();
  return new Promise((resolve) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: '/v1/chat/completions', method: 'POST', agent, headers: { 'content-type': 'application/json' } },
      (res) => {
        const head = monotonicMs() - started;
        let firstToken: number | undefined;
        res.on('data', (chunk: Buffer) => {
          if (firstToken === undefined && chunk.includes('"content"')) firstToken = monotonicMs() - started;
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, head, firstToken }));
        res.on('error', () => resolve({ status: -1, head, firstToken }));
      },
    );
    req.on('error', () => resolve({ status: -1, head: monotonicMs() - started, firstToken: undefined }));
    req.end(body);
  });
}

/** Runs `plan` in this thread. */
export async function offerLoad(plan: LoadPlan): Promise<LoadReport> {
  const url = new URL(plan.url);
  const agent = new Agent({ keepAlive: true, maxSockets: 1024 });
  const delay = monitorEventLoopDelay({ resolution: 1 });
  delay.enable();
  const outcomes: Promise<Outcome>[] = [];
  const start = monotonicMs();
  const interval = 1000 / plan.rate;
  for (let n = 0; monotonicMs() - start < plan.seconds * 1000; n++) {
    const wait = start + n * interval - monotonicMs();
    if (wait > 1) await sleep(wait);
    outcomes.push(complete(url, agent, plan.model, plan.tokens));
  }
  const done = await Promise.all(outcomes);
  delay.disable();
  agent.destroy();
  return { outcomes: done, loopDelayP99: delay.percentile(99) / 1e6 };
}

if (!isMainThread && parentPort !== null) parentPort.postMessage(await offerLoad(workerData as LoadPlan));
