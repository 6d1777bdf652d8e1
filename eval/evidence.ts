/**
 * The evidence `sluice-rag` weighs for each question, taken beside a running server: the corpus
 * indexed here with the server's own embedding model (over `/v1/embeddings`), retrieved as the
 * served pipeline retrieves, and the features abstention may decide on. What `--features` exports
 * and `eval/fit-abstain.ts` fits.
 */
import type { Passage } from '../src/ai/rag/passage.js';
import { indexPassages } from '../src/ai/rag/corpus.js';
import { LexicalIndex } from '../src/ai/rag/lexical-index.js';
import { retrievePassages } from '../src/ai/rag/retriever.js';
import type { Evidence } from '../src/ai/rag/abstain.js';

/** The served evidence of one question. */
export type QuestionEvidence = Evidence;

/** Retrieval as served (hybrid, k = 5): the question's evidence. */
export type EvidenceProbe = (question: string) => Promise<QuestionEvidence>;

/** The server's embedding model, asked over HTTP. */
function httpEmbedder(url: string): (texts: string[]) => Promise<Float32Array[]> {
  return async (texts) => {
    const response = await fetch(`${url}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sluice-embed', input: texts }),
    });
    if (response.status !== 200) throw new Error(`/v1/embeddings answered ${response.status}: ${await response.text()}`);
    const body = (await response.json()) as { data: { index: number; embedding: number[] }[] };
    return body.data.sort((a, b) => a.index - b.index).map((d) => Float32Array.from(d.embedding));
  };
}

/** Indexes `passages` with the server's embedder and returns the probe of a question's evidence. */
export async function evidenceProbe(url: string, passages: readonly Passage[]): Promise<EvidenceProbe> {
  const embed = httpEmbedder(url);
  const index = await indexPassages(passages, (texts) => embed(texts));
  const lexical = LexicalIndex.of(index.entries());
  const plan = { index, lexical, mode: 'hybrid' as const, k: 5 };
  return async (question) => {
    const [vector] = await embed([question]);
    return retrievePassages(plan, question, vector).evidence;
  };
}
