/**
 * Runs a question set against what `sluice serve --corpus DIR` answers (a server started in this
 * process, asked over its HTTP API one question at a time) and, on the same passages, a plain
 * BM25 search (MiniSearch with default options): the figures of one corpus, and every answer.
 */
import * as hdr from 'hdr-histogram-js';
import MiniSearch from 'minisearch';
import { startServer } from '../src/serve.js';
import { loadCorpus } from '../src/ai/rag/corpus.js';
import { NO_ANSWER } from '../src/ai/rag/extract.js';
import { assembleCorpus, nodeDocsRoot, type Question, type QuestionSet } from './question-set.js';
import { rate } from './report.js';

/** What the served model did with one question, beside what BM25 ranked first. */
export interface Answered {
  readonly question: Question;
  /** The answer's text; empty when the request failed. */
  readonly answer: string;
  /** The file of the first source the answer cites (`[1]`). */
  readonly citedFile: string | undefined;
  /** The answer is the no-answer text, or cites nothing. */
  readonly abstained: boolean;
  /** The guard refused the question (400 `content_policy_violation`). */
  readonly blocked: boolean;
  /** Another failure: the HTTP status and error code. */
  readonly error: string | undefined;
  /** The answer's text, sources aside, matches the question's fact. */
  readonly factHit: boolean;
  readonly latencyMs: number;
  readonly bm25: { readonly file: string | undefined; readonly factInTop3: boolean };
}

/** Figures over a set's questions; a rate is `NaN` when it has no question to count. */
export interface Figures {
  readonly covered: number;
  readonly uncovered: number;
  /** Covered questions whose first cited file is the expected one. */
  readonly precisionAt1: number;
  /** Covered questions whose answer states the fact. */
  readonly factHit: number;
  /** Uncovered questions answered with no answer. */
  readonly abstain: number;
  /** Covered questions answered with no answer (blocked or failed ones included). */
  readonly falseAbstain: number;
  readonly blocked: number;
  readonly errors: number;
  readonly p50Ms: number;
  readonly p95Ms: number;
}

/** The baseline's figures on the same covered questions. */
export interface Bm25Figures {
  /** Covered questions whose top passage is in the expected file. */
  readonly precisionAt1: number;
  /** Covered questions whose fact is in one of the top 3 passages. */
  readonly factInTop3: number;
}

export interface CorpusReport {
  readonly name: string;
  readonly files: number;
  readonly passages: number;
  /** Source files of the set that were not found (their questions left out). */
  readonly missing: readonly string[];
  readonly skippedQuestions: number;
  readonly sluice: Figures;
  readonly bm25: Bm25Figures;
  readonly answers: readonly Answered[];
}

export interface EvalOptions {
  /** The repository root: `node_modules/` and relative corpus folders are found from it. */
  readonly root: string;
  /** Folder of the model files; missing ones are generated there. */
  readonly models: string;
  readonly log?: (line: string) => void;
}

/** The file a source names (`file › heading`, or `file#id`). */
export function fileOfSource(source: string): string {
  return source.split(' › ')[0]!.split('#')[0]!.trim();
}

/** The answer's text and the sources it lists after `Sources:`, `[1]` first. */
export function splitAnswer(text: string): { readonly body: string; readonly sources: readonly string[] } {
  const at = text.lastIndexOf('\n\nSources:\n');
  if (at < 0) return { body: text, sources: [] };
  const sources = text
    .slice(at + '\n\nSources:\n'.length)
    .split('\n')
    .map((line) => /^\[\d+\]\s+(.+)$/.exec(line.trim())?.[1])
    .filter((s): s is string => s !== undefined);
  return { body: text.slice(0, at), sources };
}

/**
 * Whether `text` states `fact`: as written, or as read once Markdown's inline marks are gone (code
 * spans' backticks, emphasis, link targets, escapes), since a fact is written from what a page says
 * and an answer quotes its Markdown (`` the `--icu-data-dir` CLI parameter ``, `_is not closed_`).
 */
export function statesFact(fact: RegExp, text: string): boolean {
  return fact.test(text) || fact.test(plainText(text));
}

/** `text` without Markdown's inline marks, its whitespace collapsed. */
function plainText(text: string): string {
  return text
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/\\([\\`*_{}[\]()#+\-.!|<>])/g, '$1')
    .replace(/`/g, '')
    .replace(/(?<!\w)[*_]+|[*_]+(?!\w)/g, '')
    .replace(/\s+/g, ' ');
}

/** The answer says it has none: the no-answer text, or an answer that cites no source. */
export function isAbstention(text: string): boolean {
  const { body, sources } = splitAnswer(text);
  return body.trim() === NO_ANSWER || sources.length === 0;
}

/** Runs one set; `undefined` (with a logged reason) when none of its files is present. */
export async function evaluateSet(set: QuestionSet, options: EvalOptions): Promise<CorpusReport | undefined> {
  const log = options.log ?? (() => {});
  const corpus = await assembleCorpus(set, options.root);
  if (corpus === undefined) {
    log(
      'dir' in set.corpus
        ? `${set.name}: skipped, no folder ${set.corpus.dir} here`
        : 'npmCli' in set.corpus
          ? `${set.name}: skipped, the npm CLI has no ${set.corpus.npmCli} folder here`
          : 'nodeDocsFolder' in set.corpus
            ? `${set.name}: skipped, Node.js has no ${set.corpus.nodeDocsFolder} docs folder here`
            : 'nodeDocs' in set.corpus
              ? `${set.name}: skipped, none of its ${set.corpus.nodeDocs.length} files is in ${nodeDocsRoot()}`
              : `${set.name}: skipped, none of its ${'npm' in set.corpus ? set.corpus.npm.length : 0} files is in node_modules/`,
    );
    return undefined;
  }
  try {
    if (corpus.missing.length > 0)
      log(`${set.name}: ${corpus.missing.length} file(s) missing, ${corpus.skippedQuestions} question(s) left out: ${corpus.missing.join(', ')}`);
    const passages = await loadCorpus(corpus.dir);
    const search = new MiniSearch<{ id: string; text: string; source: string }>({ fields: ['text'], storeFields: ['text', 'source'] });
    search.addAll(passages.map((p) => ({ id: p.id, text: p.text, source: p.source })));
    const server = await startServer({ port: 0, corpus: corpus.dir, models: options.models, inspect: false });
    const answers: Answered[] = [];
    try {
      for (const question of corpus.questions) {
        const asked = await ask(server.url, question.question);
        const fact = question.fact === undefined ? undefined : new RegExp(question.fact, 'i');
        const { body, sources } = splitAnswer(asked.answer);
        const abstained = asked.blocked || asked.error !== undefined || isAbstention(asked.answer);
        const hits = search.search(question.question).slice(0, 3);
        answers.push({
          question,
          ...asked,
          citedFile: sources[0] === undefined ? undefined : fileOfSource(sources[0]),
          abstained,
          factHit: fact !== undefined && !abstained && statesFact(fact, body),
          bm25: {
            file: hits[0] === undefined ? undefined : fileOfSource(String(hits[0].source)),
            factInTop3: fact !== undefined && hits.some((hit) => statesFact(fact, String(hit.text))),
          },
        });
      }
    } finally {
      await server.shutdown();
    }
    return {
      name: set.name,
      files: new Set(passages.map((p) => fileOfSource(p.source))).size,
      passages: passages.length,
      missing: corpus.missing,
      skippedQuestions: corpus.skippedQuestions,
      ...figuresOf(answers),
      answers,
    };
  } finally {
    await corpus.remove();
  }
}

async function ask(url: string, question: string): Promise<Pick<Answered, 'answer' | 'blocked' | 'error' | 'latencyMs'>> {
  const started = performance.now();
  let status = 0;
  let body: { choices?: { message?: { content?: string } }[]; error?: { code?: string } };
  try {
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'sluice-rag', messages: [{ role: 'user', content: question }] }),
    });
    status = response.status;
    body = (await response.json()) as typeof body;
  } catch (err) {
    // A failed request is a figure of the run (counted as abstained), not the end of it.
    return {
      answer: '',
      blocked: false,
      error: `${status || 'no response'} ${err instanceof Error ? err.message : String(err)}`,
      latencyMs: performance.now() - started,
    };
  }
  const latencyMs = performance.now() - started;
  if (status === 200) return { answer: body.choices?.[0]?.message?.content ?? '', blocked: false, error: undefined, latencyMs };
  const code = body.error?.code ?? 'unknown';
  const blocked = code === 'content_policy_violation';
  return { answer: '', blocked, error: blocked ? undefined : `${status} ${code}`, latencyMs };
}

/** Every set's answers as one report (`all N sets`): the figures over all their questions together. */
export function poolReports(reports: readonly CorpusReport[]): CorpusReport {
  const answers = reports.flatMap((r) => r.answers);
  return {
    name: `all ${reports.length} sets`,
    files: reports.reduce((sum, r) => sum + r.files, 0),
    passages: reports.reduce((sum, r) => sum + r.passages, 0),
    missing: reports.flatMap((r) => r.missing),
    skippedQuestions: reports.reduce((sum, r) => sum + r.skippedQuestions, 0),
    ...figuresOf(answers),
    answers,
  };
}

/** The figures of a set's answers. */
export function figuresOf(answers: readonly Answered[]): { readonly sluice: Figures; readonly bm25: Bm25Figures } {
  const covered = answers.filter((a) => a.question.file !== undefined);
  const uncovered = answers.filter((a) => a.question.file === undefined);
  const count = (list: readonly Answered[], test: (a: Answered) => boolean) => list.filter(test).length;
  const histogram = hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 3_600_000_000, numberOfSignificantValueDigits: 3 });
  for (const a of answers) histogram.recordValue(Math.max(1, Math.round(a.latencyMs * 1000)));
  const quantileMs = (q: number) => (answers.length === 0 ? Number.NaN : histogram.getValueAtPercentile(q) / 1000);
  const sluice: Figures = {
    covered: covered.length,
    uncovered: uncovered.length,
    precisionAt1: rate(
      count(covered, (a) => !a.abstained && a.citedFile === a.question.file),
      covered.length,
    ),
    factHit: rate(
      count(covered, (a) => a.factHit),
      covered.length,
    ),
    abstain: rate(
      count(uncovered, (a) => a.abstained),
      uncovered.length,
    ),
    falseAbstain: rate(
      count(covered, (a) => a.abstained),
      covered.length,
    ),
    blocked: count(answers, (a) => a.blocked),
    errors: count(answers, (a) => a.error !== undefined),
    p50Ms: quantileMs(50),
    p95Ms: quantileMs(95),
  };
  const bm25: Bm25Figures = {
    precisionAt1: rate(
      count(covered, (a) => a.bm25.file === a.question.file),
      covered.length,
    ),
    factInTop3: rate(
      count(covered, (a) => a.bm25.factInTop3),
      covered.length,
    ),
  };
  return { sluice, bm25 };
}
