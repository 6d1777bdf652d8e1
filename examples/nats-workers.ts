/**
 * Inference on worker processes, on one machine: a nats-server with JetStream, two
 * `sluice worker` processes running the language model, one `sluice serve --nats` keeping the
 * HTTP/WebSocket edge, and a client. The same commands by hand are in docs/nats.md ("Workers").
 *
 * Needs `nats-server` on the PATH (Debian: apt-get install nats-server) and the NATS client
 * packages: npm install @nats-io/jetstream@~3.3.1 @nats-io/transport-node@~3.3.1
 *
 * Run: node --conditions=sluice-source --import tsx examples/nats-workers.ts
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

const sluice = join(dirname(createRequire(import.meta.url).resolve('sluice/package.json')), 'bin/sluice.js');
const scratch = mkdtempSync(join(tmpdir(), 'sluice-example-'));
const children: ChildProcess[] = [];

/** Starts `command` and resolves with the first match of `pattern` in what it prints. */
function start(command: string, args: string[], pattern: RegExp): Promise<RegExpExecArray> {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  let seen = '';
  return new Promise((resolve, reject) => {
    const look = (chunk: Buffer) => {
      seen += chunk.toString();
      const match = pattern.exec(seen);
      if (match) resolve(match);
    };
    child.stdout!.on('data', look);
    child.stderr!.on('data', look);
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`${command} ${args[0]} exited with ${code}:\n${seen}`)));
  });
}

try {
  // 1. nats-server with JetStream, on loopback, a free port.
  const [, port] = await start('nats-server', ['-js', '-sd', join(scratch, 'store'), '-a', '127.0.0.1', '-p', '-1'], /client connections on [^:]+:(\d+)/);
  const nats = `nats://127.0.0.1:${port}`;
  const models = join(scratch, 'models');
  // 2. Two workers: they share the link "charlm" (the first generates the model files).
  await start(process.execPath, [sluice, 'worker', '--nats', nats, '--models', models, '--pool-size', '1'], /worker: serving/);
  await start(process.execPath, [sluice, 'worker', '--nats', nats, '--models', models, '--pool-size', '1'], /worker: serving/);
  // 3. The edge: generation goes to the workers.
  const [, url] = await start(
    process.execPath,
    [sluice, 'serve', '--port', '0', '--models', models, '--pool-size', '1', '--nats', nats],
    /listening on (http:\S+)/,
  );
  // 4. A client.
  const response = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'charlm', max_tokens: 60, seed: 1, messages: [{ role: 'user', content: 'The stage' }] }),
  });
  const answer = (await response.json()) as { choices: { message: { content: string }; finish_reason: string }[] };
  console.log(`answer from a worker (${answer.choices[0]!.finish_reason}): ${JSON.stringify(answer.choices[0]!.message.content)}`);
} finally {
  for (const child of children.reverse()) child.kill('SIGTERM');
  await new Promise((resolve) => setTimeout(resolve, 500));
  rmSync(scratch, { recursive: true, force: true });
}
