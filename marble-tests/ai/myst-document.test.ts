/**
 * MyST, Sphinx's Markdown (pip's docs, Jupyter Book), read as the CommonMark the chunker knows:
 * directive fences by their kind, roles as their text, target lines as nothing; a code fence's
 * content is never touched.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { loadCorpus } from '../../src/ai/rag/corpus.js';
import { isMyst, mystToMarkdown } from '../../src/ai/rag/myst-document.js';

const lines = (...l: string[]): string => l.join('\n');

describe('MyST documents', () => {
  it('reads admonitions and version notes as labelled paragraphs, code directives as fences', () => {
    const page = lines(
      '(caching)=',
      '# Caching',
      '',
      '```{note}',
      'The cache is on by default.',
      '```',
      '',
      '```{code-block} python',
      ':caption: Example',
      'import pip',
      '```',
      '',
      ':::{tip}',
      'Run {command}`pip cache dir` to see it; see {ref}`Caching <caching>` and {pep}`517`.',
      ':::',
      '',
      '```{versionadded} 20.1',
      '```',
    );
    assert.equal(
      mystToMarkdown(page),
      lines(
        '# Caching',
        '',
        '',
        'Note: The cache is on by default.',
        '',
        '',
        '',
        '```python',
        'import pip',
        '```',
        '',
        '',
        '',
        'Tip: Run `pip cache dir` to see it; see Caching and PEP 517.',
        '',
        '',
        '',
        'Version added 20.1:',
        '',
      ),
    );
  });

  it('reads nested fences (tabs over code), eval-rst as reStructuredText, a shell session as code; a build-time directive says nothing', () => {
    const page = lines(
      '````{tab} MacOS',
      '```',
      '~/Library/Caches/pip',
      '```',
      '````',
      '',
      '```{eval-rst}',
      '.. note::',
      '',
      '   From rst, with ``code``.',
      '```',
      '',
      '```{pip-cli}',
      '$ pip cache purge',
      '```',
      '',
      '```{pip-command-usage} cache',
      '```',
    );
    assert.equal(
      mystToMarkdown(page),
      lines(
        '',
        'MacOS:',
        '',
        '```',
        '~/Library/Caches/pip',
        '```',
        '',
        '',
        '',
        'Note: From rst, with `code`.',
        '',
        '',
        '',
        '',
        '```console',
        '$ pip cache purge',
        '```',
        '',
        '',
      ),
    );
  });

  it('leaves a plain code fence as it is, roles and target lines included', () => {
    const page = lines('````markdown', '(label)=', '```{note}', 'Use {ref}`x`.', '```', '````', 'After {ref}`Intro <intro>`.');
    assert.equal(mystToMarkdown(page), lines('````markdown', '(label)=', '```{note}', 'Use {ref}`x`.', '```', '````', 'After Intro.'));
    assert.equal(
      mystToMarkdown(lines('(files)=', '', 'Global', ': In {file}`/etc/pip.conf`.', '', '  Then the user file.', '', 'Not a term', 'line two', ': colon')),
      lines('', '- Global: In `/etc/pip.conf`.', '', '  Then the user file.', '', 'Not a term', 'line two', ': colon'),
      'a definition list reads as list items; a paragraph of two lines is no term',
    );
    assert.equal(
      mystToMarkdown(lines('```{admonition} Example', 'The user requests tea.', '```')),
      lines('', 'Example: The user requests tea.', ''),
      "an admonition's title labels it",
    );
    assert.equal(isMyst('# Plain\n\nCommonMark with `code` and {braces}.\n'), false);
    assert.equal(isMyst('See {ref}`x`.'), true);
  });

  it('is read by loadCorpus, compressed or not, and a plain Markdown page is read as it is', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'sluice-myst-'));
    try {
      await writeFile(join(dir, 'caching.md.gz'), gzipSync(lines('# Caching', '', '```{warning}', 'Wheels built from a path are not cached.', '```', '')));
      await writeFile(join(dir, 'plain.md'), lines('# Plain', '', 'Text with {braces}, `code` and (parens)=x.', ''));
      const passages = await loadCorpus(dir);
      assert.deepEqual(
        passages.map((p) => [p.source, p.text]),
        [
          ['caching.md.gz › Caching', 'Warning: Wheels built from a path are not cached.'],
          ['plain.md › Plain', 'Text with {braces}, `code` and (parens)=x.'],
        ],
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('leaves no directive, role or target outside a code fence, whatever the text (property)', () => {
    const line = fc.oneof(
      fc.constantFrom('', '```', '````', ':::', '```{note}', '````{tab} X', ':::{tip}', '```{code-block} js', '(x)=', ':key: v', '---', '{ref}`a <b>`', 'text'),
      fc.string({ maxLength: 12 }),
    );
    fc.assert(
      fc.property(fc.array(line, { maxLength: 30 }), (page) => {
        let fence: string | undefined;
        for (const out of mystToMarkdown(page.join('\n')).split('\n')) {
          const plain = /^\s*(`{3,}|~{3,})(?![`~{])/.exec(out);
          if (fence !== undefined) {
            if (plain !== null && plain[1]![0] === fence[0] && plain[1]!.length >= fence.length && out.trim() === plain[1]) fence = undefined;
            continue;
          }
          if (plain !== null) fence = plain[1];
          else assert.ok(!/^\s*(?:`{3,}|:{3,})\{[\w:.-]+\}|^\s*\([\w.:-]+\)=\s*$|\{[\w:.-]+\}`[^`]*`/.test(out), out);
        }
      }),
      { numRuns: 500 },
    );
  });
});
