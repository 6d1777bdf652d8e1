/**
 * Copies among a corpus's documents: a page saved twice is read once, and a page compiling others
 * whole (mdBook's print.html) gives way to the pages on each subject, while pages that merely share
 * boilerplate keep all of theirs. Nothing is lost: every passage is kept or reported once.
 */
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { type Copy, type CorpusDocument, withoutCopies } from '../../src/ai/rag/copies.js';
import { loadCorpus } from '../../src/ai/rag/corpus.js';
import type { CorpusSkip } from '../../src/ai/rag/document-text.js';

const doc = (file: string, texts: readonly string[]): CorpusDocument => ({
  file,
  passages: texts.map((text, i) => ({ id: `${file}#${i}`, text, source: file })),
});
const chapter = (n: number): string[] => [`Chapter ${n} opens.`, `Chapter ${n} explains.`, `Chapter ${n} ends.`];

describe('withoutCopies', () => {
  it('keeps the first of documents with the same passages, whitespace aside, and reports the rest', () => {
    const copies: Copy[] = [];
    const kept = withoutCopies(
      [
        doc('a/LICENSE.txt', ['Permission is granted.', 'No warranty.']),
        doc('b/LICENSE.txt', ['Permission  is\ngranted.', 'No warranty.']),
        doc('c.md', ['Other.']),
      ],
      (copy) => copies.push(copy),
    );
    assert.deepEqual(
      kept.map((d) => d.file),
      ['a/LICENSE.txt', 'c.md'],
    );
    assert.deepEqual(copies, [{ file: 'b/LICENSE.txt', original: 'a/LICENSE.txt' }]);
  });

  it('a page compiling three chapters or more keeps only its own passages; each chapter keeps all of its own', () => {
    const copies: Copy[] = [];
    // The fourth chapter is trimmed in the compilation: what it does hold is still a copy.
    const print = doc('print.html', ['The whole book on one page.', ...chapter(1), ...chapter(2), ...chapter(3), ...chapter(4).slice(0, 2)]);
    const chapters = [1, 2, 3, 4].map((n) => doc(`ch${n}.html`, chapter(n)));
    const kept = withoutCopies([...chapters, print], (copy) => copies.push(copy));
    assert.deepEqual(
      kept.map((d) => [d.file, d.passages.length]),
      [
        ['ch1.html', 3],
        ['ch2.html', 3],
        ['ch3.html', 3],
        ['ch4.html', 3],
        ['print.html', 1],
      ],
    );
    assert.equal(kept[4]!.passages[0]!.text, 'The whole book on one page.');
    assert.equal(copies.length, 11);
    // Two chapters held whole are not enough: pages sharing boilerplate do as much.
    const two = doc('both.html', ['Both chapters.', ...chapter(1), ...chapter(2)]);
    assert.deepEqual(withoutCopies([...chapters.slice(0, 2), two], (copy) => assert.fail(`${copy.file} is no copy`))[2], two);
    assert.deepEqual(copies[0], { file: 'print.html', id: 'print.html#1', original: 'ch1.html' });
  });

  it('pages sharing boilerplate, even one holding two small pages nearly whole, lose nothing', () => {
    const common = ['Common options.', '`--verbose` prints more.', '`--quiet` prints less.', 'Exit status 0 on success.'];
    const documents = [
      doc('cargo-build.html', ['Compile the package.', ...common]),
      doc('cargo-help.html', ['Show help.', ...common]),
      doc('cargo-report.html', ['Report things.', ...common]),
      doc('cargo-vendor.html', ['Vendor dependencies.', 'Show help.', 'Report things.', ...common, 'Vendoring keeps sources.']),
    ];
    const copies: Copy[] = [];
    assert.deepEqual(
      withoutCopies(documents, (copy) => copies.push(copy)),
      documents,
    );
    // npm's pages include the same config blocks: one command's page holds every alias page's blocks, never their own line.
    const config = Array.from({ length: 10 }, (_, i) => `Config option ${i} and its default.`);
    const aliases = ['ci', 'install-test', 'install-ci-test'].map((name) => doc(`npm-${name}.md`, [`npm ${name} runs install first.`, ...config]));
    const install = doc('npm-install.md', ['npm install installs a package.', 'It reads package.json.', ...config]);
    assert.deepEqual(
      withoutCopies([...aliases, install], (copy) => copies.push(copy)),
      [...aliases, install],
    );
    assert.deepEqual(copies, []);
  });

  it('every passage is kept or reported exactly once (random corpora of shared texts)', () => {
    const texts = fc.array(fc.constantFrom('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'), { maxLength: 12 });
    fc.assert(
      fc.property(fc.array(texts, { maxLength: 8 }), (pages) => {
        const documents = pages.map((page, i) => doc(`doc-${i}.md`, page));
        const copies: Copy[] = [];
        const kept = withoutCopies(documents, (copy) => copies.push(copy));
        const byFile = new Map(documents.map((d) => [d.file, d]));
        const out = [
          ...kept.flatMap((d) => d.passages.map((p) => p.id)),
          ...copies.flatMap((c) => (c.id === undefined ? byFile.get(c.file)!.passages.map((p) => p.id) : [c.id])),
        ].sort();
        assert.deepEqual(out, documents.flatMap((d) => d.passages.map((p) => p.id)).sort());
        // An original is a document still read, holding the text of the copy left out.
        for (const copy of copies) assert.ok(kept.some((d) => d.file === copy.original));
      }),
      { numRuns: 300 },
    );
  });
});

describe('a book folder with a print page, read by loadCorpus', () => {
  it('cites each chapter, not print.html, and counts what it left out as duplicate', async () => {
    const root = await mkdtemp(join(tmpdir(), 'sluice-copies-'));
    try {
      const page = (body: string) => `<html><body><nav>Contents</nav><main>${body}</main></body></html>`;
      const body = (n: number) => `<h1>Chapter ${n}</h1><p>Chapter ${n} opens here.</p><p>Chapter ${n} says more.</p><p>Chapter ${n} ends.</p>`;
      for (const n of [1, 2, 3]) await writeFile(join(root, `ch${n}.html`), page(body(n)));
      await writeFile(join(root, 'print.html'), page(`<h1>The Book</h1><p>Every chapter on one page.</p>${body(1)}${body(2)}${body(3)}`));
      await mkdir(join(root, 'old'));
      await writeFile(join(root, 'old', 'ch1.html'), page('<p>This edition moved; read the current book.</p>'));
      await writeFile(join(root, 'old', 'ch2.html'), page('<p>This edition moved; read the current book.</p>'));
      const skips: CorpusSkip[] = [];
      const passages = await loadCorpus(root, { onSkip: (skip) => skips.push(skip) });
      assert.deepEqual(
        passages.map((p) => p.source).filter((s) => /Chapter 2/.test(s)),
        ['ch2.html › Chapter 2', 'ch2.html › Chapter 2', 'ch2.html › Chapter 2'],
      );
      assert.deepEqual(
        passages.filter((p) => p.source.startsWith('print.html')).map((p) => p.text),
        ['Every chapter on one page.'],
      );
      assert.ok(skips.every((s) => s.reason === 'duplicate'));
      assert.deepEqual(
        skips.filter((s) => s.id === undefined),
        [{ reason: 'duplicate', file: 'old/ch2.html', detail: 'the same as old/ch1.html' }],
      );
      assert.equal(skips.filter((s) => s.file === 'print.html').length, 9);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
