/**
 * Answers a user can trust, over the real generated embedding model (onnxruntime in a worker pool):
 * hybrid retrieval (dense and BM25, fused) cites the file that answers first, quotes a fact that
 * lives in a code fence or a table row, and abstains (NO_ANSWER) on questions no document covers.
 * Over the bundled corpus and over a second corpus of another subject written here, so the
 * thresholds are not tuned to one corpus.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lastValueFrom, toArray } from 'rxjs';
import { InvalidOptionsError } from '../../src/core/errors.js';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { loadTokenizer } from '../../src/ai/models/load.js';
import { ragWorker } from '../../src/ai/pipelines/rag-worker.js';
import type { PipelineWorker } from '../../src/ai/pipelines/pipeline-worker.js';
import { embedder } from '../../src/ai/pool/embedder.js';
import { InferencePool } from '../../src/ai/pool/pool.js';
import { chunkMarkdown, indexPassages, loadCorpus } from '../../src/ai/rag/corpus.js';
import { NO_ANSWER } from '../../src/ai/rag/extract.js';
import type { PassageMetadata } from '../../src/ai/rag/passage.js';
import type { RetrievalMode } from '../../src/ai/rag/retriever.js';
import type { VectorIndex } from '../../src/ai/rag/vector-index.js';
import type { Embedder } from '../../src/ai/stages/embed.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';
import { BUNDLED_COVERED, NETWORK_CORPUS, NETWORK_COVERED, NETWORK_OFF_TOPIC, OFF_TOPIC, type Covered } from '../support/rag-questions.js';

/** The whole streamed answer to `question`. */
async function ask(rag: PipelineWorker, question: string): Promise<string> {
  const tokens = await lastValueFrom(rag.generate(generateRequest({ prompt: question })).pipe(toArray()));
  return tokens.map((t) => t.text).join('');
}

/** The file cited `[1]`, from the answer's source list. */
function firstFile(answer: string): string | undefined {
  return /\n\nSources:\n\[1\] ([^\n›]+?)(?: › |\n|$)/.exec(answer)?.[1];
}

interface Tally {
  readonly rightFirst: string[];
  readonly wrongFirst: string[];
  readonly factMissed: string[];
}

async function tally(rag: PipelineWorker, covered: readonly Covered[]): Promise<Tally> {
  const result: Tally = { rightFirst: [], wrongFirst: [], factMissed: [] };
  for (const { question, file, fact } of covered) {
    const answer = await ask(rag, question);
    (firstFile(answer) === file ? result.rightFirst : result.wrongFirst).push(`${question} → ${firstFile(answer) ?? 'no answer'}`);
    if (!fact.test(answer.split('\n\nSources:')[0]!)) result.factMissed.push(`${question} → ${answer}`);
  }
  return result;
}

describe('sluice-rag answers over the real embedder: hybrid retrieval, quotable code and tables, abstention', () => {
  let models: GeneratedModels;
  let pool: InferencePool;
  let embed: Embedder;
  let network: string;
  const workers: PipelineWorker[] = [];
  const indexes = new Map<string, VectorIndex<PassageMetadata>>();

  const worker = (corpus: 'bundled' | 'network', retrieval?: RetrievalMode): PipelineWorker => {
    const rag = ragWorker({ embedder: embed, index: indexes.get(corpus)!, ...(retrieval !== undefined && { retrieval }) });
    workers.push(rag);
    return rag;
  };

  before(async () => {
    models = await generatedModels('rag-answers');
    pool = await InferencePool.create({ model: join(models.dir, MODEL_FILES.embedding), size: 1 });
    embed = embedder(pool, await loadTokenizer(join(models.dir, MODEL_FILES.embeddingTokenizer)));
    network = await mkdtemp(join(tmpdir(), 'sluice-network-'));
    for (const [file, text] of Object.entries(NETWORK_CORPUS)) await writeFile(join(network, file), text);
    indexes.set('bundled', await indexPassages(await loadCorpus(), embed));
    indexes.set('network', await indexPassages(await loadCorpus(network), embed));
  });
  after(async () => {
    for (const rag of workers) rag.close();
    await pool?.close();
    await models?.remove();
    if (network !== undefined) await rm(network, { recursive: true, force: true });
  });

  it('bundled corpus: cites the file that answers first and quotes its fact, and abstains on other subjects and libraries', async () => {
    const rag = worker('bundled');
    const { rightFirst, wrongFirst, factMissed } = await tally(rag, BUNDLED_COVERED);
    assert.deepEqual(wrongFirst, [], `${rightFirst.length}/${BUNDLED_COVERED.length} right first`);
    assert.ok(factMissed.length <= 1, `facts missed:\n${factMissed.join('\n')}`);
    for (const question of OFF_TOPIC) assert.equal(await ask(rag, question), NO_ANSWER, question);
  });

  it('a second corpus (networking, front matter, setext headings, rules, fences, tables, plain text): right file first', async () => {
    const { rightFirst, wrongFirst, factMissed } = await tally(worker('network'), NETWORK_COVERED);
    assert.deepEqual(wrongFirst, [], `${rightFirst.length}/${NETWORK_COVERED.length} right first`);
    assert.ok(factMissed.length <= 1, `facts missed:\n${factMissed.join('\n')}`);
  });

  it('a second corpus: quotes the code line and the table row (with its header) that hold the answer', async () => {
    const rag = worker('network');
    assert.match(await ask(rag, 'Which command queries the mail exchangers of a domain?'), /`dig example\.com MX \+short` \[1\]/);
    assert.match(await ask(rag, 'What does status code 429 mean?'), /Code: 429; Meaning: too many requests: the client is rate limited \[1\]/);
    assert.match(
      await ask(rag, 'Which DNS record type maps a name to an IPv6 address?'),
      /Type: AAAA; Purpose: maps a name to an IPv6 address \[1\][\s\S]*\[1\] dns\.md › Record types/,
    );
  });

  it("a second corpus: abstains on off-topic questions, the bundled corpus's questions among them", async () => {
    const rag = worker('network');
    for (const question of NETWORK_OFF_TOPIC) assert.equal(await ask(rag, question), NO_ANSWER, question);
  });

  it('each ranking works alone: lexical and dense retrieval each cite the right file and abstain off-topic', async () => {
    const lexical = worker('network', 'lexical');
    const dense = worker('network', 'dense');
    assert.equal(firstFile(await ask(lexical, 'What does status code 429 mean?')), 'http.md');
    assert.equal(firstFile(await ask(dense, 'How do I print the certificate chain a server presents?')), 'tls.md');
    assert.equal(firstFile(await ask(lexical, 'Which three packets open a TCP connection?')), 'tcp.md');
    for (const rag of [lexical, dense]) assert.equal(await ask(rag, 'What is the capital city of Australia?'), NO_ANSWER);
  });

  it('a corpus of one passage, a command, answers with it; one-character and 10,000-character questions abstain, never fail', async () => {
    const index = await indexPassages(chunkMarkdown('Install it with:\n\n```sh\nnpm install rxjs\n```\n', 'one.md'), embed);
    assert.equal(index.size, 1);
    const rag = ragWorker({ embedder: embed, index });
    workers.push(rag);
    assert.equal(await ask(rag, 'How do I install rxjs?'), 'Install it with: `npm install rxjs` [1]\n\nSources:\n[1] one.md');
    assert.equal(await ask(rag, 'What is the capital city of Australia?'), NO_ANSWER);
    assert.equal(await ask(rag, '?'), NO_ANSWER);
    assert.equal(await ask(worker('bundled'), 'lorem ipsum '.repeat(834)), NO_ANSWER);
  });

  it('bad retrieval options fail when the worker is made, naming the field', () => {
    const index = indexes.get('bundled')!;
    for (const [options, path] of [
      [{ retrieval: 'sparse' }, 'retrieval'],
      [{ abstain: { coverage: 2 } }, 'abstain.coverage'],
      [{ abstain: { names: 'yes' } }, 'abstain.names'],
      [{ extract: { context: -1 } }, 'extract.context'],
      [{ lexical: {} }, 'lexical'],
      [{ granularity: 'chapter' }, 'granularity'],
      [{ feedback: { passages: 3, terms: 10, weight: 0 } }, 'feedback.weight'],
    ] as const) {
      assert.throws(
        () => ragWorker({ embedder: embed, index, ...(options as object) }),
        (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((issue) => issue.path === path),
        path,
      );
    }
  });
});
