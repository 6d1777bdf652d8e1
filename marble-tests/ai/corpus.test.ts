/**
 * A corpus folder as users have them: prose beside `---` rules, HTML comments, empty fences,
 * logos named .md, Latin-1 notes, huge dumps and empty folders. Whatever cannot be embedded or
 * indexed is left out and counted once with its reason; the rest is indexed by the real
 * generated embedding model (onnxruntime in a worker pool); only a corpus with nothing to
 * index fails, with `CorpusError`.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import fc from 'fast-check';
import { MODEL_FILES } from '../../src/ai/models/generate.js';
import { loadTokenizer } from '../../src/ai/models/load.js';
import { embedder } from '../../src/ai/pool/embedder.js';
import { InferencePool } from '../../src/ai/pool/pool.js';
import { indexPassages, loadCorpus } from '../../src/ai/rag/corpus.js';
import type { CorpusSkip, CorpusSkipReason } from '../../src/ai/rag/document-text.js';
import { CorpusError } from '../../src/ai/rag/errors.js';
import type { Passage } from '../../src/ai/rag/passage.js';
import { CliProcess } from '../support/cli-process.js';
import { pathsOf } from '../support/invalid-options.js';
import { generatedModels, type GeneratedModels } from '../support/models.js';

type Embed = (texts: string[], signal: AbortSignal) => Promise<Float32Array[]>;

/** A paragraph the embedder has words for: two to six words of a small vocabulary, some accented. */
const wordParagraph = fc
  .array(fc.constantFrom('stage', 'queue', 'demand', 'café', 'naïve', 'Größe', '42', 'tokens', 'flow', 'river', 'tide', '東京'), { minLength: 2, maxLength: 6 })
  .map((words) => `${words.join(' ')}.`);

/** A paragraph with no word in it: what Markdown and HTML leave between the prose. */
const junkParagraph = fc.constantFrom(
  '---',
  '***',
  '___',
  '- - -',
  '...',
  '| --- | --- |',
  '<!-- a note for editors -->',
  '<br>',
  '```\n```',
  '> ---',
  '* * *',
  '—',
  '¶ §',
);

/** A horizontal rule separates passages and is never one: nothing to index and nothing to report. */
const RULES = new Set(['---', '***', '___', '- - -', '* * *']);

type Paragraph = { readonly kind: 'words' | 'junk' | 'rule'; readonly text: string };
const paragraph = fc.oneof(
  wordParagraph.map((text): Paragraph => ({ kind: 'words', text })),
  junkParagraph.map((text): Paragraph => ({ kind: RULES.has(text) ? 'rule' : 'junk', text })),
);

/** A file of the corpus: a Markdown document of paragraphs, or one that is not text at all. */
type CorpusFile =
  | { readonly kind: 'markdown'; readonly heading: boolean; readonly paragraphs: readonly Paragraph[]; readonly utf16: boolean }
  | { readonly kind: 'binary' | 'not-utf8' | 'too-large' | 'latin1' };
const corpusFile: fc.Arbitrary<CorpusFile> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('markdown' as const),
      heading: fc.boolean(),
      paragraphs: fc.array(paragraph, { maxLength: 6 }),
      utf16: fc.boolean(),
    }),
  },
  { weight: 1, arbitrary: fc.constantFrom('binary' as const, 'not-utf8' as const, 'too-large' as const, 'latin1' as const).map((kind) => ({ kind })) },
);

const MAX_FILE_BYTES = 4096;
/** A paragraph of a file written in Latin-1, not UTF-8: read in the charset its bytes show. */
const LATIN1_TEXT = 'Le café ouvre à midi, la crème brûlée est très bonne.';

function bytesOf(file: CorpusFile): Buffer {
  switch (file.kind) {
    case 'binary':
      return Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d]);
    case 'not-utf8':
      // Bytes of no charset at all, and no NUL among them.
      return Buffer.from(Array.from({ length: 256 }, (_, i) => ((i * 97) % 255) + 1));
    case 'latin1':
      return Buffer.from(`${LATIN1_TEXT}\n`, 'latin1');
    case 'too-large':
      return Buffer.from(`${'stage queue demand '.repeat(MAX_FILE_BYTES / 8)}\n`);
    case 'markdown': {
      const text = `${file.heading ? '# A heading\n\n' : ''}${file.paragraphs.map((p) => p.text).join('\n\n')}\n`;
      return file.utf16 ? Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(text, 'utf16le')]) : Buffer.from(text);
    }
  }
}

/** Writes the files (in subfolders, with an empty folder beside them) and returns what each should become. */
async function writeCorpus(dir: string, files: readonly CorpusFile[]) {
  await mkdir(join(dir, 'empty', 'deeper'), { recursive: true });
  const expected = { words: [] as string[], junk: 0, empty: 0, copies: 0, files: new Map<CorpusSkipReason, number>() };
  // A document with the same passages as one read before it is a copy, read once (path order: `doc-0.md` < `part-1/…`).
  const read = new Set<string>();
  const words = (texts: string[]) => {
    const key = texts.join('\u0000');
    if (texts.length > 0 && read.has(key)) expected.copies++;
    else expected.words.push(...texts);
    read.add(key);
  };
  const order = files
    .map((file, i) => ({ file, i, path: i % 3 === 0 ? `doc-${i}.md` : `part-${i % 3}/doc-${i}.md` }))
    .sort((a, b) => (a.path < b.path ? -1 : 1));
  for (const { file, i, path } of order) {
    const folder = i % 3 === 0 ? dir : join(dir, `part-${i % 3}`);
    await mkdir(folder, { recursive: true });
    await writeFile(join(dir, path), bytesOf(file));
    if (file.kind === 'latin1') words([LATIN1_TEXT]);
    else if (file.kind !== 'markdown') expected.files.set(file.kind, (expected.files.get(file.kind) ?? 0) + 1);
    else {
      // A first `---` that a later `---` or `...` closes, only YAML-like lines between, is front matter: read, never reported.
      const close =
        file.heading || file.paragraphs[0]?.text !== '---' ? -1 : file.paragraphs.findIndex((p, j) => j > 0 && (p.text === '---' || p.text === '...'));
      const yaml = close > 0 && file.paragraphs.slice(1, close).every((p) => p.text === '- - -');
      const texts: string[] = [];
      for (const p of yaml ? file.paragraphs.slice(close + 1) : file.paragraphs) {
        if (p.kind === 'words') texts.push(p.text);
        else if (p.kind === 'junk') expected.junk++;
      }
      words(texts);
      // Empty, or headings and rules only: read, and counted as giving nothing.
      if ((yaml ? file.paragraphs.slice(close + 1) : file.paragraphs).every((p) => p.kind === 'rule')) expected.empty++;
    }
  }
  return expected;
}

function counted(skips: readonly CorpusSkip[]): Map<CorpusSkipReason, number> {
  const counts = new Map<CorpusSkipReason, number>();
  for (const skip of skips) counts.set(skip.reason, (counts.get(skip.reason) ?? 0) + 1);
  return counts;
}

describe('loadCorpus and indexPassages options', () => {
  it('are checked before a file is read or a passage embedded, naming each bad field', async () => {
    await assert.rejects(
      loadCorpus('no/such/dir', { maxFileBytes: 0, onskip: () => {}, ignore: 'internals/' } as never),
      (error) => pathsOf(error).join() === 'ignore,maxFileBytes,onskip',
    );
    const embed = async () => assert.fail('nothing is embedded');
    await assert.rejects(
      indexPassages([], embed, { batchSize: 1.5, signal: 'stop', corpus: 7, batch: 2 } as never),
      (error) => pathsOf(error).join() === 'batch,batchSize,corpus,signal',
    );
  });
});

describe('documents left out by .sluiceignore and the ignore option', () => {
  let root: string;
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'sluice-corpus-ignore-'));
  });
  after(() => rm(root, { recursive: true, force: true }));

  const write = async (dir: string, files: Record<string, string>) => {
    for (const [file, text] of Object.entries(files)) {
      await mkdir(join(dir, file, '..'), { recursive: true });
      await writeFile(join(dir, file), text);
    }
  };

  it('leaves out what git would ignore, reports each file once as ignored, and loads the rest', async () => {
    const dir = join(root, 'docs');
    await write(dir, {
      'guide.md': '# Guide\n\nA stage pauses its producer.\n',
      'internals/diary.md': '# Diary\n\nFigures of a run.\n',
      'internals/deep/more.md': 'More figures.\n',
      'drafts/a.md': 'A draft.\n',
      'drafts/keep.md': 'A draft worth keeping.\n',
      'old-guide.md': 'Outdated.\n',
      'api/internals.md': 'A page named internals, not in that folder.\n',
      '.sluiceignore': '# maintainers only\n/internals/\n\ndrafts/*.md\n!drafts/keep.md\n',
    });
    const skips: CorpusSkip[] = [];
    const passages = await loadCorpus(dir, { ignore: ['old-*.md'], onSkip: (skip) => skips.push(skip) });
    assert.deepEqual([...new Set(passages.map((p) => p.source.split(' › ')[0]))], ['api/internals.md', 'drafts/keep.md', 'guide.md']);
    assert.deepEqual(
      skips.map((skip) => [skip.reason, skip.file]),
      [
        ['ignored', 'drafts/a.md'],
        ['ignored', 'internals/deep/more.md'],
        ['ignored', 'internals/diary.md'],
        ['ignored', 'old-guide.md'],
      ],
    );
  });

  it('a folder whose every document is ignored fails with CorpusError, saying so', async () => {
    const dir = join(root, 'all-ignored');
    await write(dir, { 'a.md': 'Words.\n', 'b/c.txt': 'More words.\n' });
    await assert.rejects(
      loadCorpus(dir, { ignore: ['*.md', '*.txt'] }),
      (err: unknown) => err instanceof CorpusError && err.reason === 'no-documents' && /all of its 2 documents are ignored/.test(err.message),
    );
  });
});

describe('gzip-compressed documents (Debian ships /usr/share/doc so)', () => {
  let root: string;
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'sluice-corpus-gz-'));
  });
  after(() => rm(root, { recursive: true, force: true }));

  it('reads each as the format it holds, cites it by its own name, and skips a broken or oversized one with its reason', async () => {
    const dir = join(root, 'docs');
    await mkdir(join(dir, 'dev'), { recursive: true });
    await writeFile(join(dir, 'dev', 'ci.rst.gz'), gzipSync('Continuous integration\n======================\n\nEvery pull request runs the linters first.\n'));
    await writeFile(join(dir, 'notes.md.GZ'), gzipSync('# Notes\n\nThe cache lives in a folder of its own.\n'));
    await writeFile(join(dir, 'page.html.gz'), gzipSync('<html><body><main><h1>Install</h1><p>Run the installer once.</p></main></body></html>'));
    await writeFile(join(dir, 'plain.md'), 'A file as it is.\n');
    await writeFile(join(dir, 'broken.md.gz'), Buffer.from('not gzip at all'));
    // Small compressed, huge uncompressed: stopped at the limit, never inflated whole.
    await writeFile(join(dir, 'bomb.txt.gz'), gzipSync(Buffer.alloc(4 * 1024 * 1024, 'a word ')));
    await writeFile(join(dir, 'archive.tar.gz'), gzipSync('not a document'));
    const skips: CorpusSkip[] = [];
    const passages = await loadCorpus(dir, { maxFileBytes: 1024 * 1024, onSkip: (skip) => skips.push(skip) });
    assert.deepEqual(
      passages.map((p) => [p.source, p.text]),
      [
        ['dev/ci.rst.gz › Continuous integration', 'Every pull request runs the linters first.'],
        ['notes.md.GZ › Notes', 'The cache lives in a folder of its own.'],
        ['page.html.gz › Install', 'Run the installer once.'],
        ['plain.md', 'A file as it is.'],
      ],
    );
    assert.deepEqual(
      skips.map((skip) => [skip.reason, skip.file]),
      [
        ['too-large', 'bomb.txt.gz'],
        ['unreadable', 'broken.md.gz'],
      ],
    );
    assert.match(skips[0]!.detail ?? '', /more than 1048576 bytes uncompressed/);
  });
});

describe('a corpus folder with passages and files that cannot be indexed', () => {
  let models: GeneratedModels;
  let pool: InferencePool;
  let embed: Embed;
  let root: string;

  before(async () => {
    models = await generatedModels('corpus');
    pool = await InferencePool.create({ model: join(models.dir, MODEL_FILES.embedding), size: 1 });
    const run = embedder(pool, await loadTokenizer(join(models.dir, MODEL_FILES.embeddingTokenizer)));
    embed = (texts, signal) => run(texts, signal);
    root = await mkdtemp(join(tmpdir(), 'sluice-corpus-'));
  });
  after(async () => {
    await pool?.close();
    await models?.remove();
    if (root !== undefined) await rm(root, { recursive: true, force: true });
  });

  it('the real embedder gives a Markdown rule no direction: indexing one would fail, so it is left out', async () => {
    const [rule, prose] = await embed(['---', 'a stage pauses its producer'], new AbortController().signal);
    assert.ok(
      rule!.every((x) => x === 0),
      'the generated embedder has no word to embed in "---"',
    );
    assert.ok(prose!.some((x) => x !== 0));
    const skips: CorpusSkip[] = [];
    const passages: Passage[] = [
      { id: 'a#1', text: 'a stage pauses its producer', source: 'a.md' },
      { id: 'a#2', text: '---', source: 'a.md' },
    ];
    const index = await indexPassages(passages, embed, { onSkip: (s) => skips.push(s) });
    assert.deepEqual([index.size, index.has('a#1')], [1, true]);
    assert.deepEqual(skips, [{ reason: 'no-text', file: 'a.md', id: 'a#2' }]);
  });

  it('indexes every paragraph with words and counts everything else once, by reason (random corpora)', async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(corpusFile, { maxLength: 7 }), async (files) => {
        const dir = join(root, `run-${run++}`);
        const expected = await writeCorpus(dir, files);
        const skips: CorpusSkip[] = [];
        const onSkip = (skip: CorpusSkip) => skips.push(skip);
        const load = async () => indexPassages(await loadCorpus(dir, { maxFileBytes: MAX_FILE_BYTES, onSkip }), embed, { onSkip, corpus: dir });
        if (expected.words.length === 0) {
          // Nothing to index: a clear error naming the folder, never a crash nor an empty index.
          await assert.rejects(
            load(),
            (err: unknown) => err instanceof CorpusError && err.directory === dir && /no-documents|nothing-indexable/.test(err.reason),
          );
          return;
        }
        const index = await load();
        const indexed = index.scoreAll(new Float32Array(index.dim).fill(1)).map(({ id }) => index.get(id)!.text);
        assert.deepEqual([...indexed].sort(), [...expected.words].sort(), 'every paragraph with words, and nothing else');
        const counts = counted(skips);
        assert.equal(counts.get('no-text') ?? 0, expected.junk + expected.empty, 'each paragraph without a word once, a rule never, an empty file once');
        for (const reason of ['binary', 'not-utf8', 'too-large'] as const) assert.equal(counts.get(reason) ?? 0, expected.files.get(reason) ?? 0, reason);
        assert.equal(counts.get('duplicate') ?? 0, expected.copies, 'a copy of a document read before, once');
        assert.equal(counts.get('not-embeddable') ?? 0, 0);
        assert.equal(new Set(skips.map((s) => s.id ?? s.file)).size, skips.length, 'nothing reported twice');
      }),
      { numRuns: 40 },
    );
  });

  it('an embedder that fails on one passage, or gives it an unusable vector, loses only that passage', async () => {
    const passages: Passage[] = ['one stage', 'two stages', 'poison pill', 'three stages', 'zero vector'].map((text, i) => ({
      id: `p${i}`,
      text,
      source: `f${i}.md`,
    }));
    const picky: Embed = async (texts, signal) => {
      if (texts.includes('poison pill')) throw new TypeError('cannot embed this');
      const vectors = await embed(texts, signal);
      return texts.map((text, i) => (text === 'zero vector' ? new Float32Array(vectors[i]!.length) : vectors[i]!));
    };
    const skips: CorpusSkip[] = [];
    const index = await indexPassages(passages, picky, { batchSize: 4, onSkip: (s) => skips.push(s) });
    assert.deepEqual(
      ['p0', 'p1', 'p3'].map((id) => index.has(id)),
      [true, true, true],
    );
    assert.equal(index.size, 3);
    assert.deepEqual(
      skips.map((s) => [s.id, s.reason]),
      [
        ['p2', 'not-embeddable'],
        ['p4', 'not-embeddable'],
      ],
    );
    assert.match(skips[0]!.detail ?? '', /cannot embed this/);
    // Nothing left: the error says so and carries the embedder's own.
    await assert.rejects(
      indexPassages([passages[2]!], picky, { corpus: 'docs' }),
      (err: unknown) => err instanceof CorpusError && err.reason === 'nothing-indexable' && err.cause instanceof TypeError && /corpus docs/.test(err.message),
    );
  });

  it('a folder that is missing, a file, empty, or holds only markup fails with CorpusError naming it', async () => {
    const cases: [string, string][] = [
      [join(root, 'nowhere'), 'missing'],
      [join(root, 'empty-folder'), 'no-documents'],
      [join(root, 'only-markup'), 'nothing-indexable'],
    ];
    await mkdir(join(root, 'empty-folder', 'sub'), { recursive: true });
    await mkdir(join(root, 'only-markup'), { recursive: true });
    await writeFile(join(root, 'only-markup', 'rules.md'), '---\n\n***\n\n<!-- todo -->\n');
    await writeFile(join(root, 'a-file.md'), 'words here\n');
    cases.push([join(root, 'a-file.md'), 'not-a-directory']);
    for (const [dir, reason] of cases) {
      await assert.rejects(
        loadCorpus(dir),
        (err: unknown) => err instanceof CorpusError && err.reason === reason && err.directory === dir,
        `${dir}: ${reason}`,
      );
    }
  });

  it('sluice serve --corpus --retrieval lexical starts over a folder with `---` rules (separators, never passages), an empty file and one over --corpus-max-file-bytes, logging what it left out once; a bad --corpus or --retrieval exits 2 naming it', async () => {
    const docs = join(root, 'docs-with-rules');
    await mkdir(docs, { recursive: true });
    await writeFile(join(docs, 'guide.md'), '# Guide\n\nA stage pauses its producer when its queue is full.\n\n---\n\nQueues are bounded.\n\n---\n');
    await writeFile(join(docs, 'logo.md'), Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0x00]));
    await mkdir(join(docs, 'notes'), { recursive: true });
    await writeFile(join(docs, 'notes', 'diary.md'), '# Diary\n\nA stage pauses its producer: figures of one run.\n');
    await writeFile(join(docs, 'empty.md'), '');
    await writeFile(join(docs, 'manual.md'), `# Manual\n\n${'A stage pauses its producer. '.repeat(100)}\n`);
    const server = CliProcess.start('serve', [
      ...['--port', '0', '--models', models.dir, '--corpus', docs, '--pool-size', '1', '--retrieval', 'lexical'],
      ...['--corpus-ignore', 'notes/', '--corpus-max-file-bytes', '2048'],
    ]);
    try {
      const url = await server.url();
      const lines = server.stderr.split('\n').filter((line) => line.includes('skipped'));
      assert.equal(lines.length, 1, server.output());
      assert.match(lines[0]!, /skipped 4: 1 ignored \(notes\/diary\.md\), 1 no-text \(empty\.md\), 1 binary \(logo\.md\), 1 too-large \(manual\.md\)/);
      assert.match(server.stderr, /indexed 2 passages/);
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'sluice-rag', messages: [{ role: 'user', content: 'When does a stage pause its producer?' }] }),
      });
      assert.equal(res.status, 200);
      assert.match(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content, /guide\.md › Guide/);
    } finally {
      assert.equal(await server.stop(), 0);
    }
    for (const [dir, message] of [
      [join(root, 'nowhere'), /^sluice: --corpus \S+nowhere: no such directory\n/],
      [join(root, 'only-markup'), /^sluice: --corpus \S+only-markup: no paragraph with a word in it/],
    ] as const) {
      const failed = CliProcess.start('serve', ['--port', '0', '--models', models.dir, '--corpus', dir]);
      assert.equal(await failed.exit(), 2, failed.output());
      assert.match(failed.stderr, message);
    }
    const badMode = CliProcess.start('serve', ['--port', '0', '--models', models.dir, '--corpus', docs, '--retrieval', 'sparse']);
    assert.equal(await badMode.exit(), 2, badMode.output());
    assert.match(badMode.stderr, /^sluice: --retrieval: retrieval must be one of hybrid, dense, lexical\n/);
  });
});
