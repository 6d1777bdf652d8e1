/** `pipelineWorker` and `streamStage`: one long-lived pipeline shared by every request, each with its own token stream. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { TestSink, eventually } from 'sluice/testing';
import { ScriptedWorker } from 'sluice/testing/ai';
import { AdmissionRejectedError, InvalidOptionsError } from '../../src/core/errors.js';
import { StageStats } from '../../src/flow/stats.js';
import { stage } from '../../operators/stage.js';
import { generateRequest, type GenerateRequest, type Token } from '../../src/ai/inference/worker.js';
import { Intake } from '../../src/ai/pipelines/intake.js';
import { streamStage, pipelineWorker, type PipelineJob, type PipelineWorker } from '../../src/ai/pipelines/pipeline-worker.js';

/** The worker's tokens and terminal for one request. */
function run(worker: PipelineWorker, request: GenerateRequest, signal?: AbortSignal) {
  const tokens: string[] = [];
  let terminals = 0;
  const ended = new Promise<unknown>((resolve) =>
    worker.generate(generateRequest(request), signal === undefined ? {} : { signal }).subscribe({
      next: (t: Token) => tokens.push(t.text),
      error: (err: unknown) => {
        terminals++;
        resolve(err);
      },
      complete: () => {
        terminals++;
        resolve(undefined);
      },
    }),
  );
  return { tokens, ended, terminals: () => terminals };
}

function shared(model: ScriptedWorker, options: { maxQueue?: number; concurrency?: number; capacity?: number; stats?: StageStats } = {}) {
  const intake = new Intake({ maxQueue: options.maxQueue ?? 16 });
  const stats = options.stats ?? new StageStats();
  const worker = pipelineWorker({
    name: 'lm',
    intake,
    pipeline: (jobs) =>
      jobs.pipe(
        streamStage((job: PipelineJob) => model.generate(job.request, job.options), {
          concurrency: options.concurrency ?? 2,
          capacity: options.capacity ?? 2,
          stats,
        }),
      ),
  });
  return { intake, worker, stats };
}

describe('pipelineWorker', () => {
  it('answers concurrent requests through one pipeline: each its own tokens, one terminal, at most `concurrency` streams at once', async () => {
    const model = new ScriptedWorker({ tokens: 'echo', delay: 'turn' });
    const { worker, stats, intake } = shared(model, { concurrency: 2, capacity: 1 });
    let peak = 0;
    const probe = setInterval(() => (peak = Math.max(peak, stats.inFlight)), 0);
    const runs = Array.from({ length: 6 }, (_, i) => run(worker, { prompt: `question ${i} here` }));
    const errors = await Promise.all(runs.map((r) => r.ended));
    clearInterval(probe);
    assert.deepEqual(errors, new Array(6).fill(undefined));
    runs.forEach((r, i) => {
      assert.equal(r.tokens.join(''), `question ${i} here`);
      assert.equal(r.terminals(), 1);
    });
    assert.ok(peak <= 2, `peak ${peak} streams`);
    await eventually(() => assert.equal(stats.delivered, 6));
    assert.equal(stats.received, 6);
    assert.equal(intake.stats.delivered, 6);
    assert.equal(worker.active, 0);
  });

  it('refuses a request at once when the intake is full, with ADMISSION_REJECTED and a retry hint', async () => {
    const model = new ScriptedWorker({ tokens: { repeat: 'x ' }, delay: 'turn', hang: { after: 1 } });
    const { worker, intake } = shared(model, { maxQueue: 1, concurrency: 1, capacity: 1 });
    const controller = new AbortController();
    // One streams, one waits in the stage's buffer, one in the intake: the fourth finds no room.
    const held = [0, 1, 2].map(() => run(worker, { prompt: 'p', max_tokens: 1000 }, controller.signal));
    await eventually(() => assert.equal(intake.waiting, 1));
    const refused = run(worker, { prompt: 'q' });
    const error = await refused.ended;
    assert.ok(error instanceof AdmissionRejectedError, String(error));
    assert.ok(error.retryAfter >= 1000);
    assert.equal(refused.tokens.length, 0);
    assert.equal(intake.stats.shed['buffer-full'], 1);
    controller.abort();
    await Promise.all(held.map((h) => h.ended));
    assert.deepEqual(
      held.map((h) => h.terminals()),
      [1, 1, 1],
    );
  });

  it('a request withdrawn while it waits never reaches the model', async () => {
    const model = new ScriptedWorker({ tokens: { repeat: 'x ' }, delay: 'turn', hang: { after: 1 } });
    const { worker, intake } = shared(model, { concurrency: 1, capacity: 1 });
    const controller = new AbortController();
    const first = run(worker, { prompt: 'one', max_tokens: 1000 }, controller.signal);
    run(worker, { prompt: 'two', max_tokens: 1000 }, controller.signal);
    const sink = TestSink.subscribe(worker.generate(generateRequest({ prompt: 'three' })));
    sink.request(10);
    await eventually(() => assert.equal(intake.waiting, 1));
    sink.cancel();
    assert.equal(intake.stats.shed.cancelled, 1);
    controller.abort();
    await first.ended;
    assert.ok(!model.requests.some((r) => r.prompt === 'three'));
  });

  it("a client's demand reaches the model: two tokens asked, at most two steps taken; a cancel frees the slot", async () => {
    const model = new ScriptedWorker({ tokens: { repeat: 'x ' }, delay: 'turn' });
    const { worker } = shared(model, { concurrency: 1, capacity: 1 });
    const sink = TestSink.subscribe(worker.generate(generateRequest({ prompt: 'p', max_tokens: 1000 })));
    sink.request(2);
    await eventually(() => assert.equal(sink.received.length, 2));
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(sink.received.length, 2);
    assert.ok(model.last().steps <= 3, `${model.last().steps} steps`);
    sink.cancel();
    await eventually(() => assert.equal(model.last().signal?.aborted, true));
    const next = run(worker, { prompt: 'after cancel', max_tokens: 2 });
    assert.equal(await next.ended, undefined);
    assert.equal(next.tokens.length, 2);
  });

  it('a request failing in a stage ends alone; the others and the pipeline go on', async () => {
    const model = new ScriptedWorker({ tokens: 'echo', delay: 'turn' });
    const intake = new Intake({ maxQueue: 8 });
    const worker = pipelineWorker({
      name: 'lm',
      intake,
      pipeline: (jobs) =>
        jobs.pipe(
          stage(
            (job: PipelineJob) => {
              if (job.request.prompt === 'bad') throw new Error('no');
              return job;
            },
            { name: 'check', errorPolicy: 'skip', onFailure: ({ value, error }) => value.fail(error) },
          ),
          streamStage((job: PipelineJob) => model.generate(job.request, job.options)),
        ),
    });
    const runs = ['good one', 'bad', 'good two'].map((prompt) => run(worker, { prompt }));
    const errors = await Promise.all(runs.map((r) => r.ended));
    assert.equal(errors[0], undefined);
    assert.ok(errors[1] instanceof Error);
    assert.equal(errors[2], undefined);
    assert.equal(runs[2]!.tokens.join(''), 'good two');
  });

  it('fails the requests inside a pipeline that errors, then builds it again for the next request', async () => {
    const model = new ScriptedWorker({ tokens: 'echo', delay: 'turn' });
    const intake = new Intake({ maxQueue: 8 });
    let built = 0;
    const worker = pipelineWorker({
      name: 'lm',
      intake,
      pipeline: (jobs) => {
        built++;
        return jobs.pipe(
          stage((job: PipelineJob) => {
            if (job.request.prompt === 'crash') throw new Error('the pipeline broke');
            return job;
          }),
          streamStage((job: PipelineJob) => model.generate(job.request, job.options)),
        );
      },
    });
    const crashed = run(worker, { prompt: 'crash' });
    const error = await crashed.ended;
    assert.equal((error as { code?: string }).code, 'PIPELINE_STOPPED');
    assert.equal(crashed.terminals(), 1);
    const after = run(worker, { prompt: 'fine now' });
    assert.equal(await after.ended, undefined);
    assert.equal(after.tokens.join(''), 'fine now');
    assert.equal(built, 2);
  });

  it('close() ends the requests inside with SHUTDOWN and refuses new ones', async () => {
    const model = new ScriptedWorker({ tokens: { repeat: 'x ' }, delay: 'turn', hang: { after: 1 } });
    const { worker } = shared(model);
    const running = run(worker, { prompt: 'p', max_tokens: 1000 });
    await eventually(() => assert.ok(running.tokens.length > 0, 'a first token'));
    worker.close();
    assert.equal(((await running.ended) as { code?: string }).code, 'PIPELINE_STOPPED');
    assert.equal(((await run(worker, { prompt: 'late' }).ended) as { code?: string }).code, 'SHUTDOWN');
  });

  it('fails at construction naming the bad field', () => {
    assert.throws(
      () => pipelineWorker({ name: '', intake: new Intake({ maxQueue: 1 }), pipeline: (jobs) => jobs }),
      (err: unknown) => err instanceof InvalidOptionsError && err.issues[0]?.path === 'name',
    );
  });
});
