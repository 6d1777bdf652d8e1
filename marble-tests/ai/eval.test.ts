import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtemp, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { isAbsolute, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gunzipSync } from 'node:zlib';
import { htmlToMarkdown, isHtmlFile } from '../../src/ai/rag/html-document.js';
import { evaluateSet, figuresOf, isAbstention, poolReports, splitAnswer, statesFact, type Answered, type CorpusReport } from '../../eval/harness.js';
import { NO_ANSWER } from '../../src/ai/rag/extract.js';
import { assembleCorpus, nodeDocsRoot, npmCliRoot, readQuestionSet, type QuestionSet } from '../../eval/question-set.js';
import { formatGuard, formatReport, missedGoals, missedGuard } from '../../eval/report.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

const root = fileURLToPath(new URL('../..', import.meta.url));

/** The version of the npm CLI the eval reads npm's docs from. */
async function npmVersion(): Promise<string> {
  return (JSON.parse(await readFile(join(npmCliRoot(), 'package.json'), 'utf8')) as { version: string }).version;
}
const BUNDLED_FILES = ['backpressure.md', 'batching.md', 'policies.md', 'retrieval.md', 'traces.md'];

describe('npm run eval', () => {
  let models: GeneratedModels;
  let scratch: string;
  before(async () => {
    models = await generatedModels('eval');
    scratch = await mkdtemp(join(tmpdir(), 'sluice-eval-test-'));
  });
  after(async () => {
    await models.remove();
    await rm(scratch, { recursive: true, force: true });
  });

  it('scores the served answers and BM25 hits: an expected file that does not exist is never right first', async () => {
    const set: QuestionSet = {
      name: 'impossible',
      corpus: { dir: 'data/corpus' },
      questions: [
        { question: 'What error does the fail policy raise?', file: 'nowhere.md', fact: '.' },
        { question: 'When does a micro-batch get emitted?', file: 'nowhere.md', fact: 'zz-never-stated-zz' },
        { question: 'Who painted the Mona Lisa?' },
      ],
    };
    const report = (await evaluateSet(set, { root, models: models.dir })) as CorpusReport;
    assert.equal(report.files, 5);
    assert.equal(report.answers.length, 3);
    assert.deepEqual([report.sluice.covered, report.sluice.uncovered], [2, 1]);
    assert.equal(report.sluice.precisionAt1, 0);
    assert.equal(report.bm25.precisionAt1, 0);
    for (const answer of report.answers) {
      assert.ok(answer.answer.length > 0, `an answer to "${answer.question.question}"`);
      // Real answers: what sluice cites and what BM25 ranks first are files of the corpus.
      if (!answer.abstained) assert.ok(BUNDLED_FILES.includes(answer.citedFile ?? ''), `cited ${answer.citedFile}`);
      assert.ok(BUNDLED_FILES.includes(answer.bm25.file ?? ''), `BM25 ranked ${answer.bm25.file}`);
    }
    // A fact anything matches is in every answer that is not an abstention, and in BM25's top 3; one nothing states is in none.
    assert.equal(report.sluice.factHit, (report.answers[0]!.abstained ? 0 : 1) / 2);
    assert.equal(report.bm25.factInTop3, 1 / 2);
    assert.equal(report.sluice.abstain, report.answers[2]!.abstained ? 1 : 0);
    assert.ok(report.sluice.p50Ms > 0 && report.sluice.p95Ms >= report.sluice.p50Ms, `p50 ${report.sluice.p50Ms}, p95 ${report.sluice.p95Ms}`);
    assert.ok(missedGoals(report).some((line) => line.includes('cited file right first 0.0 %')));
    const table = formatReport(report);
    assert.match(table, /^impossible: 5 files, \d+ passages; 2 covered and 1 uncovered questions/);
    assert.match(table, /cited file right first \(p@1\)\s+0\.0 % \(0\/2\)\s+0\.0 % \(0\/2\)/);
    // A rate just under its goal never prints as the goal: 449 of 499 is 89.98 %.
    const near = { ...report, sluice: { ...report.sluice, covered: 499, precisionAt1: 449 / 499 } };
    assert.match(formatReport(near), /cited file right first \(p@1\)\s+89\.9 % \(449\/499\)/);
    assert.ok(missedGoals(near).some((line) => line.includes('cited file right first 89.9 % < 90.0 %')));
  });

  it('credits the file an answer cites first, in a corpus where only one file states the fact', async () => {
    const dir = join(scratch, 'two-files');
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'lighthouse.md'), '# Lighthouse\n\nThe lighthouse keeper winds the lamp clock every evening at six o’clock sharp.\n');
    await writeFile(join(dir, 'garden.md'), '# Garden\n\nThe gardener waters the tomato beds every morning before breakfast.\n');
    const set: QuestionSet = {
      name: 'two-files',
      corpus: { dir },
      questions: [{ question: 'When does the lighthouse keeper wind the lamp clock?', file: 'lighthouse.md', fact: 'six' }],
    };
    const report = (await evaluateSet(set, { root, models: models.dir })) as CorpusReport;
    const [answer] = report.answers;
    assert.equal(answer!.bm25.file, 'lighthouse.md');
    assert.equal(report.bm25.precisionAt1, 1);
    assert.equal(report.bm25.factInTop3, 1);
    assert.equal(report.sluice.precisionAt1, answer!.abstained ? 0 : answer!.citedFile === 'lighthouse.md' ? 1 : 0);
    if (!answer!.abstained) assert.equal(splitAnswer(answer!.answer).sources[0]?.split(' › ')[0], answer!.citedFile);
  });

  it('leaves out the questions of an npm file that is not installed, and says so', async () => {
    const lines: string[] = [];
    const set: QuestionSet = {
      name: 'partly-installed',
      corpus: { npm: ['rxjs/README.md', 'no-such-package-here/README.md'] },
      questions: [
        { question: 'How do I install RxJS?', file: 'rxjs/README.md', fact: 'npm install rxjs' },
        { question: 'What does it do?', file: 'no-such-package-here/README.md', fact: 'x' },
        { question: 'Who won the 2014 World Cup?' },
      ],
    };
    const report = (await evaluateSet(set, { root, models: models.dir, log: (line) => lines.push(line) })) as CorpusReport;
    assert.deepEqual(report.missing, ['no-such-package-here/README.md']);
    assert.equal(report.skippedQuestions, 1);
    assert.deepEqual([report.sluice.covered, report.sluice.uncovered], [1, 1]);
    assert.ok(
      lines.some((line) => line.includes('no-such-package-here/README.md')),
      lines.join('\n'),
    );
    const none = await evaluateSet(
      { ...set, name: 'not-installed', corpus: { npm: ['no-such-package-here/README.md'] } },
      { root, models: models.dir, log: (line) => lines.push(line) },
    );
    assert.equal(none, undefined);
    assert.ok(
      lines.some((line) => line.startsWith('not-installed: skipped')),
      lines.join('\n'),
    );
  });

  it('exits 0 as a measurement, 1 under --check when a goal is missed, and writes the answers with --json', async () => {
    const sets = join(scratch, 'sets');
    await mkdir(sets, { recursive: true });
    await writeFile(
      join(sets, 'tiny.json'),
      JSON.stringify({
        name: 'tiny',
        corpus: { dir: 'data/corpus' },
        questions: [{ question: 'What is the default policy?', file: 'nowhere.md', fact: 'pause' }],
      }),
    );
    const run = (...args: string[]) =>
      spawnSync(process.execPath, ['--conditions=sluice-source', '--import', 'tsx', 'eval/run.ts', '--sets', sets, '--models', models.dir, ...args], {
        cwd: root,
        encoding: 'utf8',
        timeout: 60_000,
      });
    await writeFile(
      join(sets, 'tiny2.json'),
      JSON.stringify({ name: 'tiny2', corpus: { dir: 'data/corpus' }, questions: [{ question: 'What is the capital city of Australia?' }] }),
    );
    const json = join(scratch, 'report.json');
    const checked = run('--check', '--json', json);
    assert.equal(checked.status, 1, checked.stderr);
    assert.match(checked.stdout, /tiny: 5 files/);
    assert.match(checked.stdout, /all 2 sets: 10 files, \d+ passages; 1 covered and 1 uncovered questions/);
    assert.match(checked.stdout, /guard: 0 of 2 ordinary questions blocked/);
    assert.match(checked.stdout, /MISS tiny: cited file right first 0\.0 %/);
    const written = JSON.parse(await readFile(json, 'utf8')) as { reports: CorpusReport[] };
    assert.equal(written.reports.length, 2);
    assert.equal(written.reports[0]!.answers.length, 1);
    const measured = run();
    assert.equal(measured.status, 0, measured.stderr);
    assert.doesNotMatch(measured.stdout, /MISS/);
  });
});

describe('the figures of every set together', () => {
  const answered = (file: string | undefined, got: Partial<Answered>): Answered => ({
    question: { question: 'q', ...(file !== undefined && { file, fact: 'x' }) },
    answer: '',
    citedFile: undefined,
    abstained: true,
    blocked: false,
    error: undefined,
    factHit: false,
    latencyMs: 1,
    bm25: { file: undefined, factInTop3: false },
    ...got,
  });
  const report = (name: string, answers: Answered[]): CorpusReport => ({
    name,
    files: 2,
    passages: 10,
    missing: [],
    skippedQuestions: 0,
    ...figuresOf(answers),
    answers,
  });

  it('are counted over all the questions, not averaged over the sets', () => {
    const a = report('a', [answered('a.md', { abstained: false, citedFile: 'a.md', factHit: true }), answered(undefined, {})]);
    const b = report('b', [
      answered('b.md', { abstained: false, citedFile: 'c.md' }),
      answered('b.md', { abstained: false, citedFile: 'b.md' }),
      answered('b.md', { blocked: true }),
    ]);
    const all = poolReports([a, b]);
    assert.equal(all.name, 'all 2 sets');
    assert.equal(all.files, 4);
    assert.equal(all.sluice.covered, 4);
    assert.equal(all.sluice.uncovered, 1);
    assert.equal(all.sluice.precisionAt1, 2 / 4);
    assert.equal(all.sluice.factHit, 1 / 4);
    assert.equal(all.sluice.abstain, 1);
    assert.equal(all.sluice.blocked, 1);
    assert.match(formatGuard(all), /guard: 1 of 5 ordinary questions blocked \(20\.0 %; goal at most 1 in 50\)/);
    assert.match(missedGuard(all) ?? '', /20\.0 % of the questions blocked by the guard > 2\.0 %/);
    // One in fifty is within the goal.
    const once = poolReports([
      report('d', [answered('d.md', { blocked: true })]),
      report(
        'c',
        Array.from({ length: 49 }, () => answered(undefined, {})),
      ),
    ]);
    assert.equal(missedGuard(once), undefined);
  });
});

describe('reading an answer', () => {
  it('takes the no-answer text, or an answer citing nothing, as an abstention; a cited answer as an answer', () => {
    assert.equal(isAbstention(NO_ANSWER), true);
    assert.equal(isAbstention('Something without any source.'), true);
    const cited = 'A policy says what happens. [1] Demand flows upstream. [2]\n\nSources:\n[1] policies.md › The vocabulary\n[2] backpressure.md › Demand';
    assert.equal(isAbstention(cited), false);
    assert.deepEqual(splitAnswer(cited).sources, ['policies.md › The vocabulary', 'backpressure.md › Demand']);
    assert.equal(splitAnswer(cited).body, 'A policy says what happens. [1] Demand flows upstream. [2]');
  });

  it('finds a fact in what the answer says, whether or not its Markdown marks split the words', () => {
    const says = (fact: string, text: string) => statesFact(new RegExp(fact, 'i'), text);
    assert.equal(says('icu-data-dir\\s*CLI parameter has', 'the `--icu-data-dir` CLI parameter has the highest precedence'), true);
    assert.equal(says("'deflate'\\s*,\\s*'gzip'", "One of `'deflate'`, `'gzip'`."), true);
    assert.equal(says('is not closed automatically', 'the destination _is not closed_ automatically'), true);
    assert.equal(says('see the manual', 'see [the manual](https://example.com/m) first'), true);
    assert.equal(says('ERR_INVALID_ARG_TYPE', 'throws ERR\\_INVALID\\_ARG\\_TYPE'), true);
    assert.equal(says('__dirname', 'use `__dirname` there'), true, 'as written still counts');
    assert.equal(says('is closed automatically', 'the destination _is not closed_ automatically'), false);
  });
});

describe('the shipped question sets', () => {
  it('are valid, and every fact is stated in the file its question names', async () => {
    const dir = join(root, 'eval', 'sets');
    const files = (await readdir(dir)).filter((f) => f.endsWith('.json'));
    assert.ok(files.length >= 2);
    for (const file of files) {
      const set = await readQuestionSet(join(dir, file));
      // npm's docs are those of whichever npm runs the tests: a set over them is checked when the npm it was written for runs.
      if ('npmCli' in set.corpus && !set.description?.includes(`npm ${await npmVersion()}`)) continue;
      // Node's docs likewise are those installed with the node that runs the tests.
      if (('nodeDocs' in set.corpus || 'nodeDocsFolder' in set.corpus) && !set.description?.includes(`Node.js ${process.version}`)) continue;
      if ('dir' in set.corpus && isAbsolute(set.corpus.dir) && !existsSync(set.corpus.dir)) continue;
      const base =
        'dir' in set.corpus
          ? resolve(root, set.corpus.dir)
          : 'npmCli' in set.corpus
            ? join(npmCliRoot(), set.corpus.npmCli)
            : 'nodeDocs' in set.corpus
              ? nodeDocsRoot()
              : 'nodeDocsFolder' in set.corpus
                ? join(nodeDocsRoot(), '..', set.corpus.nodeDocsFolder)
                : join(root, 'node_modules');
      for (const q of set.questions) {
        if (q.file === undefined || !existsSync(join(base, q.file))) continue;
        const bytes = await readFile(join(base, q.file));
        // A page is checked as the corpus reads it: a compressed one as what it holds, an HTML page as its Markdown.
        const raw = (q.file.endsWith('.gz') ? gunzipSync(bytes) : bytes).toString('utf8');
        const text = isHtmlFile(q.file.replace(/\.gz$/, '')) ? await htmlToMarkdown(raw) : raw;
        assert.ok(statesFact(new RegExp(q.fact!, 'i'), text), `${file}: "${q.question}" — its fact is not in ${q.file}`);
      }
    }
  });

  it('reads a folder of the npm CLI that runs it, leaving out the questions of files this npm lacks, and skips a set whose folder it lacks', async () => {
    const fake = await mkdtemp(join(tmpdir(), 'sluice-eval-npm-cli-'));
    const saved = process.env.npm_execpath;
    try {
      await mkdir(join(fake, 'npm', 'bin'), { recursive: true });
      await writeFile(join(fake, 'npm', 'bin', 'npm-cli.js'), '');
      await mkdir(join(fake, 'npm', 'docs', 'content', 'commands'), { recursive: true });
      await writeFile(join(fake, 'npm', 'docs', 'content', 'commands', 'npm-ci.md'), '# npm ci\n\nIt deletes node_modules first.\n');
      process.env.npm_execpath = join(fake, 'npm', 'bin', 'npm-cli.js');
      assert.equal(npmCliRoot(), join(fake, 'npm'));
      const set: QuestionSet = {
        name: 'npm-cli',
        corpus: { npmCli: 'docs/content' },
        questions: [
          { question: 'Does npm ci delete node_modules?', file: 'commands/npm-ci.md', fact: 'deletes node_modules' },
          { question: 'What does npm gone do?', file: 'commands/npm-gone.md', fact: 'x' },
          { question: 'Who won the 2014 World Cup?' },
        ],
      };
      const corpus = (await assembleCorpus(set, root))!;
      assert.equal(corpus.dir, join(fake, 'npm', 'docs', 'content'));
      assert.deepEqual(corpus.missing, ['commands/npm-gone.md']);
      assert.deepEqual(
        corpus.questions.map((q) => q.question),
        ['Does npm ci delete node_modules?', 'Who won the 2014 World Cup?'],
      );
      assert.equal(await assembleCorpus({ ...set, corpus: { npmCli: 'docs/none' } }, root), undefined);
    } finally {
      if (saved === undefined) delete process.env.npm_execpath;
      else process.env.npm_execpath = saved;
      await rm(fake, { recursive: true, force: true });
    }
  });

  it("reads the Node.js docs installed beside the node that runs it, and a question's file must be one it lists", async () => {
    assert.equal(nodeDocsRoot(join('/opt', 'node20', 'bin', 'node')), join('/opt', 'node20', 'share', 'doc', 'nodejs', 'api'));
    const path = join(tmpdir(), `sluice-eval-node-docs-${process.pid}.json`);
    const set = (file: string) => ({ name: 'node', corpus: { nodeDocs: ['path.md'] }, questions: [{ question: 'How do I join paths?', file, fact: 'join' }] });
    try {
      await writeFile(path, JSON.stringify(set('path.md')));
      assert.deepEqual((await readQuestionSet(path)).corpus, { nodeDocs: ['path.md'] });
      await writeFile(path, JSON.stringify(set('fs.md')));
      await assert.rejects(readQuestionSet(path), /questions\.0\.file: fs\.md is not in corpus\.nodeDocs/);
    } finally {
      await rm(path, { force: true });
    }
    const corpus = await assembleCorpus(
      { name: 'node', corpus: { nodeDocs: ['path.md', 'no-such-module.md'] }, questions: [{ question: 'Who won the 2014 World Cup?' }] },
      root,
    );
    if (!existsSync(join(nodeDocsRoot(), 'path.md'))) return assert.equal(corpus, undefined);
    try {
      assert.deepEqual(corpus!.missing, ['no-such-module.md']);
      assert.ok(existsSync(join(corpus!.dir, 'path.md')));
    } finally {
      await corpus!.remove();
    }
  });

  it('skips a set over an absolute folder this machine lacks', async () => {
    const questions = [{ question: 'Who won the 2014 World Cup?' }];
    assert.equal(await assembleCorpus({ name: 'gone', corpus: { dir: join(tmpdir(), `sluice-no-such-${process.pid}`) }, questions }, root), undefined);
    assert.equal((await assembleCorpus({ name: 'here', corpus: { dir: tmpdir() }, questions }, root))!.dir, tmpdir());
  });

  it('reads a folder of the Node.js docs as it is, and skips a set whose folder is not installed', async () => {
    const questions = [
      { question: 'How do I land a pull request?', file: 'pull-requests.md', fact: 'pull request' },
      { question: 'Who won the 2014 World Cup?' },
    ];
    assert.equal(await assembleCorpus({ name: 'guides', corpus: { nodeDocsFolder: 'no-such-folder' }, questions }, root), undefined);
    const corpus = await assembleCorpus({ name: 'guides', corpus: { nodeDocsFolder: 'api' }, questions }, root);
    if (!existsSync(nodeDocsRoot())) return assert.equal(corpus, undefined);
    assert.equal(corpus!.dir, nodeDocsRoot());
    assert.deepEqual(corpus!.missing, ['pull-requests.md']);
    assert.deepEqual(corpus!.questions, [questions[1]]);
  });

  it('rejects a covered question without its fact, naming the field', async () => {
    const path = join(tmpdir(), `sluice-eval-bad-${process.pid}.json`);
    await writeFile(path, JSON.stringify({ name: 'bad', corpus: { dir: 'data/corpus' }, questions: [{ question: 'Q?', file: 'policies.md' }] }));
    try {
      await assert.rejects(readQuestionSet(path), /questions\.0: a covered question has both file and fact/);
    } finally {
      await rm(path, { force: true });
    }
  });
});
