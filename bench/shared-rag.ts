/**
 * The RAG path at many concurrent questions: `ragWorker`'s shared pipeline with the guard and the
 * embedder batched across the questions in flight (`BatchedClassifier`, `BatchedEmbedder`, as
 * `sluice serve` runs it), beside the same shared pipeline whose guard and embedder run one pool
 * job per call, and beside per-request chains: each question its own one-element chain through
 * stages built for it (guard → embed → retrieve → assemble → generate, one pool job per call),
 * as the server answered before its pipeline was shared (issue 36's baseline). Same pool, models,
 * corpus, caches and questions, in turns within one run: questions per second, pool runs and
 * the process's CPU time (every thread) per question.
 *
 *     node --conditions=sluice-source --import tsx bench/shared-rag.ts
 *
 * Environment: BENCH_RAG_CLIENTS=64 (questions in flight), BENCH_RAG_QUESTIONS=1280 (per round),
 * BENCH_RAG_ROUNDS=3 (per configuration), BENCH_RAG_CORPUS (a folder of Markdown; default the bundled corpus).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { generateModels, MODEL_FILES } from '../src/ai/models/generate.js';
import { loadTokenizer } from '../src/ai/models/load.js';
import { InferencePool } from '../src/ai/pool/pool.js';
import { embedder } from '../src/ai/pool/embedder.js';
import { poolClassifier } from '../src/ai/pool/classifier.js';
import { BatchedEmbedder } from '../src/ai/pipelines/batched-embedder.js';
import { BatchedClassifier } from '../src/ai/pipelines/batched-classifier.js';
import { ragPipeline, ragWorker, type RagPipeline } from '../src/ai/pipelines/rag-worker.js';
import type { PipelineJob } from '../src/ai/pipelines/pipeline-worker.js';
import { generateRequest, type GenerateRequest } from '../src/ai/inference/worker.js';
import { traced } from '../src/core/trace.js';
import { fromIterable } from '../src/flow/sources.js';
import { lastValueFrom, toArray } from 'rxjs';
import { Intake } from '../src/ai/pipelines/intake.js';
import { indexPassages, loadCorpus } from '../src/ai/rag/corpus.js';
import { BUNDLED_DATA } from '../src/ai/models/bundled.js';
import { envInt, formatRatio, median, monotonicMs, selected, target, textTable, type TargetCheck } from './harness.js';

export interface SharedRagResult {
  readonly id: string;
  readonly questionsPerSecond: number;
  readonly poolRunsPerQuestion: number;
  /** CPU time of the whole process (main thread and pool threads), ms per question: steadier than questions/s on a shared machine. */
  readonly cpuMsPerQuestion: number;
}

export const RAG_SCENARIOS = [
  { id: 'rag-shared-batched', batched: true },
  { id: 'rag-shared-unbatched', batched: false },
  { id: 'rag-per-request-chains', batched: false },
] as const;

const QUESTIONS = [
  'How does a stage pause a fast producer?',
  'What happens when the buffer is full?',
  'How are tokens streamed over WebSocket?',
  'What does the inspector show?',
  'How is a request cancelled?',
  'What does shed-oldest do?',
  'How are embeddings cached?',
  'What is the transit timeout?',
];

export async function measureSharedRag(onProgress: (message: string) => void = () => {}): Promise<{ results: SharedRagResult[]; checks: TargetCheck[] }> {
  const clients = envInt('BENCH_RAG_CLIENTS', 64);
  const questions = envInt('BENCH_RAG_QUESTIONS', 1280);
  const rounds = envInt('BENCH_RAG_ROUNDS', 3);
  const dir = await mkdtemp(join(tmpdir(), 'sluice-bench-rag-'));
  await generateModels({ outDir: dir, dataDir: BUNDLED_DATA! });
  const pool = await InferencePool.create({ name: 'bench', models: { embed: join(dir, MODEL_FILES.embedding), guard: join(dir, MODEL_FILES.guard) }, size: 2 });
  try {
    const tokenizer = await loadTokenizer(join(dir, MODEL_FILES.embeddingTokenizer));
    const plainEmbed = embedder(pool, tokenizer, { model: 'embed' });
    const index = await indexPassages(await loadCorpus(process.env.BENCH_RAG_CORPUS || undefined), plainEmbed);
    const batchedEmbed = new BatchedEmbedder(pool, tokenizer, { model: 'embed' });
    const batchedGuard = new BatchedClassifier(pool, tokenizer, { model: 'guard' });
    // Every question answered, off-topic ones too: the work per question stays what this section has always measured.
    const common = { index, abstain: false } as const;
    const workers = {
      'rag-shared-batched': ragWorker({
        ...common,
        embedder: batchedEmbed.embedder,
        classify: batchedGuard.classify,
        intake: new Intake({ maxQueue: clients }),
        batch: clients,
        streams: clients,
      }),
      'rag-shared-unbatched': ragWorker({
        ...common,
        embedder: plainEmbed,
        classify: poolClassifier(pool, tokenizer, { model: 'guard' }),
        intake: new Intake({ maxQueue: clients }),
        batch: clients,
        streams: clients,
      }),
    };
    const chains = perRequestChains(
      ragPipeline({ ...common, embedder: plainEmbed, classify: poolClassifier(pool, tokenizer, { model: 'guard' }), batch: 1, streams: 1 }),
    );
    const askers: Record<(typeof RAG_SCENARIOS)[number]['id'], (request: GenerateRequest) => Promise<unknown>> = {
      'rag-shared-batched': (request) => workers['rag-shared-batched'].infer(request),
      'rag-shared-unbatched': (request) => workers['rag-shared-unbatched'].infer(request),
      'rag-per-request-chains': chains,
    };
    const scenarios = RAG_SCENARIOS.filter((s) => selected(s.id));
    const perScenario = new Map(scenarios.map((s) => [s.id, { rates: [] as number[], runs: [] as number[], cpu: [] as number[] }]));
    // Numbered across rounds and configurations: each question is new to the question cache, as distinct users' questions are.
    let numbered = 0;
    const round = async (id: keyof typeof askers, n: number) => {
      const ask = askers[id];
      let next = 0;
      const before = pool.stats.submitted;
      const cpuBefore = process.cpuUsage();
      const started = monotonicMs();
      await Promise.all(
        Array.from({ length: clients }, async () => {
          while (next < n) {
            next++;
            const n_ = numbered++;
            const question = `${QUESTIONS[n_ % QUESTIONS.length]!} (${n_})`;
            await ask(generateRequest({ prompt: question, max_tokens: 40 }));
          }
        }),
      );
      const cpu = process.cpuUsage(cpuBefore);
      return { rate: n / ((monotonicMs() - started) / 1000), runs: (pool.stats.submitted - before) / n, cpu: (cpu.user + cpu.system) / 1000 / n };
    };
    for (const s of scenarios) await round(s.id, Math.min(questions, 200)); // warm-up
    for (let r = 0; r < rounds; r++) {
      for (let i = 0; i < scenarios.length; i++) {
        const s = scenarios[(i + r) % scenarios.length]!;
        const { rate, runs, cpu } = await round(s.id, questions);
        perScenario.get(s.id)!.rates.push(rate);
        perScenario.get(s.id)!.runs.push(runs);
        perScenario.get(s.id)!.cpu.push(cpu);
        onProgress(`${s.id} round ${r + 1}: ${rate.toFixed(0)} questions/s, ${runs.toFixed(2)} pool runs, ${cpu.toFixed(2)} CPU ms per question`);
      }
    }
    for (const worker of Object.values(workers)) worker.close();
    batchedEmbed.close();
    batchedGuard.close();
    const results = scenarios.map((s) => ({
      id: s.id,
      questionsPerSecond: median(perScenario.get(s.id)!.rates),
      poolRunsPerQuestion: median(perScenario.get(s.id)!.runs),
      cpuMsPerQuestion: median(perScenario.get(s.id)!.cpu),
    }));
    const shared = results.find((r) => r.id === 'rag-shared-batched');
    const alone = results.find((r) => r.id === 'rag-shared-unbatched');
    const chained = results.find((r) => r.id === 'rag-per-request-chains');
    const checks = [
      ...(shared === undefined || alone === undefined
        ? []
        : [
            target(
              `RAG at ${clients} in flight: questions/s, batched ÷ a pool run per call`,
              shared.questionsPerSecond / alone.questionsPerSecond,
              '×',
              'ge',
              2,
            ),
            target('pool runs per question, batched ÷ a pool run per call', shared.poolRunsPerQuestion / alone.poolRunsPerQuestion, '×', 'le', 0.25),
          ]),
      ...(shared === undefined || chained === undefined
        ? []
        : [
            target(
              `RAG at ${clients} in flight: questions/s, batched ÷ per-request chains`,
              shared.questionsPerSecond / chained.questionsPerSecond,
              '×',
              'ge',
              2,
            ),
            target('pool runs per question, batched ÷ per-request chains', shared.poolRunsPerQuestion / chained.poolRunsPerQuestion, '×', 'le', 0.25),
          ]),
    ];
    return { results, checks };
  } finally {
    await pool.close();
    await rm(dir, { recursive: true, force: true });
  }
}

export function sharedRagReport(results: readonly SharedRagResult[], checks: readonly TargetCheck[]): string {
  const rows = results.map((r) => [r.id, r.questionsPerSecond.toFixed(0), r.poolRunsPerQuestion.toFixed(2), r.cpuMsPerQuestion.toFixed(2)]);
  const judged = checks.map((c) => [c.what, formatRatio(c.measured), `${c.comparison === 'ge' ? '≥' : '≤'} ${c.limit}×`, c.pass ? 'PASS' : 'MISS']);
  return `${textTable(['scenario', 'questions/s', 'pool runs per question', 'CPU ms per question'], rows)}\n${textTable(['ratio', 'measured', 'target', ''], judged)}\nload average ${loadavg()[0]!.toFixed(1)}`;
}

/**
 * Each question through its own one-element chain, built for it and dropped after it: the stages
 * `rag.pipeline` builds, fed `[question]` alone, the answer's tokens collected as `infer` collects them.
 */
function perRequestChains(rag: RagPipeline): (request: GenerateRequest) => Promise<string> {
  return (request) =>
    new Promise<string>((resolve, reject) => {
      const signal = new AbortController().signal;
      const job: PipelineJob = {
        request,
        options: { signal, trace: traced(null).trace },
        stream: (tokens) =>
          lastValueFrom(tokens.pipe(toArray())).then(
            (all) => resolve(all.map((t) => t.text).join('')),
            (error: unknown) => reject(error),
          ),
        fail: reject,
      };
      rag.pipeline(fromIterable([traced(job)])).subscribe({ error: reject });
    });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const { results, checks } = await measureSharedRag((m) => process.stderr.write(`${m}\n`));
  console.log(sharedRagReport(results, checks));
}
