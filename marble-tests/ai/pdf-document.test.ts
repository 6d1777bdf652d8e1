import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { loadCorpus } from '../../src/ai/rag/corpus.js';
import type { CorpusSkip } from '../../src/ai/rag/document-text.js';
import { isPdfFile, pdfToMarkdown } from '../../src/ai/rag/pdf-document.js';
import { type PdfLine, pdfOf } from '../support/pdf-file.js';

/** A page of a manual: its running header, a heading, a paragraph over two lines, another paragraph, its number. */
const page = (n: number, heading: string, first: readonly [string, string], second: string): PdfLine[] => [
  [9, 72, 760, 'The Sluice Manual'],
  [20, 72, 700, heading],
  [11, 72, 670, first[0]],
  [11, 72, 656, first[1]],
  [11, 72, 620, second],
  [9, 300, 40, String(n)],
];

const MANUAL = pdfOf([
  page(1, 'Queues', ['A stage pauses its produc-', 'er when its queue is full.'], 'Capacity is 16 by default.'),
  page(2, 'Policies', ['Shedding drops the newest', 'element and counts it.'], 'Failing ends the flow with an error.'),
  page(3, 'Traces', ['Every element carries a', 'traceparent.'], 'Timings are sampled.'),
]);

describe('a PDF in a corpus', () => {
  it('reads headings by their size, paragraphs by their spacing, broken words whole, without running headers or page numbers', async () => {
    assert.equal(
      await pdfToMarkdown(MANUAL),
      [
        '# Queues',
        '',
        'A stage pauses its producer when its queue is full.',
        '',
        'Capacity is 16 by default.',
        '',
        '# Policies',
        '',
        'Shedding drops the newest',
        'element and counts it.',
        '',
        'Failing ends the flow with an error.',
        '',
        '# Traces',
        '',
        'Every element carries a',
        'traceparent.',
        '',
        'Timings are sampled.',
        '',
      ].join('\n'),
    );
  });

  it("keeps a line Markdown would read as markup (a listing's `# comment`, a `---`) as text", async () => {
    const listing = pdfOf([
      [
        [11, 72, 700, 'Install it:'],
        [11, 72, 686, '# install the tools'],
        [11, 72, 672, '---'],
        [11, 72, 658, 'npm ci'],
      ],
    ]);
    assert.equal(await pdfToMarkdown(listing), 'Install it:\n\\# install the tools\n\\---\nnpm ci\n');
  });

  it('is read by loadCorpus under its headings; one pdf.js cannot read is skipped as unreadable, the rest loaded', async () => {
    assert.equal(isPdfFile('docs/Manual.PDF'), true);
    assert.equal(isPdfFile('pdf.md'), false);
    const dir = await mkdtemp(join(tmpdir(), 'sluice-pdf-'));
    try {
      await writeFile(join(dir, 'manual.pdf'), MANUAL);
      await writeFile(join(dir, 'broken.pdf'), '%PDF-1.4\nthis is not a PDF at all\n');
      const skipped: CorpusSkip[] = [];
      const passages = await loadCorpus(dir, { onSkip: (skip) => skipped.push(skip) });
      assert.deepEqual(
        passages.filter((p) => p.source === 'manual.pdf › Policies').map((p) => p.text),
        ['Shedding drops the newest\nelement and counts it.', 'Failing ends the flow with an error.'],
      );
      assert.deepEqual(
        skipped.map((s) => [s.file, s.reason]),
        [['broken.pdf', 'unreadable']],
      );
      assert.ok(skipped[0]!.detail !== undefined && skipped[0]!.detail.length > 0, 'with what pdf.js said');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
