/**
 * `sluice serve --nats` with two `sluice worker` processes, as a user starts them: the serving
 * process keeps the HTTP edge, the workers run the language model, and a client's cancel reaches
 * the worker that generates for it.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { CliProcess } from '../support/cli-process.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { startNatsServer, type NatsServer } from '../support/nats-server.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

describe('sluice serve --nats with two sluice worker processes', () => {
  let nats: NatsServer;
  let models: string;
  let generated: GeneratedModels | undefined;
  let workers: CliProcess[] = [];
  let serve: CliProcess | undefined;
  let url: string;

  before(async () => {
    models = (generated = await generatedModels('nats-serve')).dir;
    nats = await startNatsServer();
    workers = [0, 1].map(() => CliProcess.start('worker', ['--nats', nats.url, '--models', models, '--pool-size', '1', '--concurrency', '2']));
    await Promise.all(workers.map((worker) => worker.waitFor(/worker: serving charlm/)));
    serve = CliProcess.start('serve', ['--port', '0', '--models', models, '--pool-size', '1', '--nats', nats.url]);
    url = await serve.url().catch((err: unknown) => {
      throw new Error(`${String(err)}\n${nats.state()}`);
    });
  });
  after(async () => {
    await serve?.stop().catch(() => serve?.kill());
    await Promise.all(workers.map((worker) => worker.stop().catch(() => worker.kill())));
    await nats?.close();
    await generated?.remove();
  });

  const complete = (body: object, signal?: AbortSignal) =>
    fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal });

  it('answers chat completions generated on the workers, and both workers share the work', async () => {
    const answers = await Promise.all(
      Array.from({ length: 6 }, (_, i) => complete({ model: 'charlm', max_tokens: 40, seed: i, messages: [{ role: 'user', content: 'The stage' }] })),
    );
    for (const answer of answers) {
      assert.equal(answer.status, 200);
      const body = (await answer.json()) as { choices: { message: { content: string }; finish_reason: string }[]; usage: { completion_tokens: number } };
      assert.ok(body.choices[0]!.message.content.length > 0);
      assert.ok(['stop', 'length'].includes(body.choices[0]!.finish_reason));
    }
    // A worker logs a request after sending its end: the line may come just after the response.
    const ended = () => workers.map((worker) => (worker.stderr.match(/: end after/g) ?? []).length);
    const deadline = Date.now() + 5_000;
    while (ended().reduce((a, b) => a + b, 0) < 6 && Date.now() < deadline) await sleep(20);
    await sleep(100); // and none more
    const served = ended();
    assert.equal(
      served.reduce((a, b) => a + b, 0),
      6,
      `each request generated once (${served})`,
    );
    assert.ok(
      served.every((n) => n >= 1),
      `both workers generated (${served})`,
    );
  });

  it('the same seed gives the same completion whichever worker runs it', async () => {
    const ask = async () =>
      (
        (await (await complete({ model: 'charlm', max_tokens: 30, seed: 42, temperature: 0.9, messages: [{ role: 'user', content: 'x' }] })).json()) as {
          choices: { message: { content: string } }[];
        }
      ).choices[0]!.message.content;
    const [a, b, c] = await Promise.all([ask(), ask(), ask()]);
    assert.equal(a, b);
    assert.equal(b, c);
  });

  it('a streaming client that leaves: its cancel reaches the worker, which stops generating', async () => {
    const controller = new AbortController();
    const response = await complete({ model: 'charlm', stream: true, max_tokens: 4000, messages: [{ role: 'user', content: 'The stage' }] }, controller.signal);
    assert.equal(response.status, 200);
    const reader = response.body!.getReader();
    let chunks = 0;
    while (chunks < 3) {
      const { done } = await reader.read();
      if (done) break;
      chunks++;
    }
    controller.abort();
    const deadline = Date.now() + 10_000;
    while (!workers.some((worker) => /: cancelled after \d+ tokens/.test(worker.stderr)) && Date.now() < deadline) await sleep(50);
    const line = workers.map((worker) => /: cancelled after (\d+) tokens/.exec(worker.stderr)).find((match) => match !== null);
    assert.ok(line, `a worker logged the cancel:\n${workers.map((worker) => worker.output()).join('\n')}`);
    assert.ok(Number(line![1]) < 4000, 'it stopped long before max_tokens');
  });

  it('an unreachable NATS server: worker and serve exit 1 at start-up, naming the URL', () => {
    for (const command of ['worker', 'serve']) {
      const result = spawnSync(
        process.execPath,
        ['bin/sluice.js', command, '--nats', 'nats://127.0.0.1:1', '--models', models, '--port', '0'].slice(0, command === 'worker' ? 6 : 8),
        {
          cwd: root,
          encoding: 'utf8',
          timeout: 60_000,
        },
      );
      assert.equal(result.status, 1, `${command}: ${result.stderr}`);
      assert.match(result.stderr, /cannot reach the NATS server at nats:\/\/127\.0\.0\.1:1/);
    }
  });
});
