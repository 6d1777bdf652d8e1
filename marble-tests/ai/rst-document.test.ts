import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { loadCorpus } from '../../src/ai/rag/corpus.js';
import { isRstFile, rstToMarkdown } from '../../src/ai/rag/rst-document.js';

const PAGE = [
  '=========',
  ' MyLib',
  '=========',
  '',
  '.. _intro:',
  '',
  'Introduction',
  '============',
  '',
  'MyLib reads :func:`mylib.load` files. See `the docs <https://x.org>`_ and :ref:`Install <install>`.',
  '',
  '.. note::',
  '   The default timeout is 30 seconds.',
  '',
  'Usage',
  '-----',
  '',
  'Call it like this::',
  '',
  '    import mylib',
  '    mylib.load("x")',
  '',
  '.. code-block:: python',
  '   :linenos:',
  '',
  '   x = 1',
  '',
  'Options',
  '~~~~~~~',
  '',
  '- ``timeout``: seconds to wait.',
  '  Defaults to 30.',
  '',
  '.. This is a comment',
  '   spanning lines.',
  '',
  '.. toctree::',
  '   :maxdepth: 2',
  '',
  '   install',
  '',
  '~~~~',
  '',
  'More',
  '----',
  '',
  'Done.',
].join('\n');

describe('a reStructuredText page in a corpus', () => {
  it('reads titles by their adornment, in the order the page first uses each', () => {
    const headings = rstToMarkdown(PAGE)
      .split('\n')
      .filter((line) => line.startsWith('#'));
    assert.deepEqual(headings, ['# MyLib', '## Introduction', '### Usage', '#### Options', '### More']);
  });

  it('quotes literal blocks and code directives as fences, admonitions with their label, roles and links as their text', () => {
    const markdown = rstToMarkdown(PAGE);
    assert.match(markdown, /MyLib reads `mylib\.load` files\. See the docs and Install\./);
    assert.match(markdown, /Note: The default timeout is 30 seconds\./);
    assert.match(markdown, /Call it like this:\n\n```\nimport mylib\nmylib\.load\("x"\)\n```/);
    assert.match(markdown, /```python\nx = 1\n```/);
    assert.match(markdown, /- `timeout`: seconds to wait\.\nDefaults to 30\./);
    for (const gone of ['comment', '_intro', 'toctree', 'maxdepth', 'install\n', '~~~']) assert.ok(!markdown.includes(gone), gone);
  });

  it("heads an API directive's description with its signature, a level below its section", () => {
    const page = [
      'Files',
      '=====',
      '',
      ".. py:function:: open(file, mode='r')",
      '',
      '   Open *file*; raises :exc:`OSError`.',
      '',
      '   :param file: the path.',
      '',
    ].join('\n');
    assert.equal(rstToMarkdown(page), "# Files\n\n## `open(file, mode='r')`\n\nOpen *file*; raises `OSError`.\n\nparam file: the path.\n");
  });

  it('dates the paragraph after a version note without content, and labels one with content', () => {
    const page = ['.. versionadded:: 3.17', '', 'In this variant, lists are walked together.', '', '.. deprecated:: 3.20', '   Use ``block()``.', ''].join(
      '\n',
    );
    assert.equal(rstToMarkdown(page), 'Version added 3.17: In this variant, lists are walked together.\n\nDeprecated 3.20: Use `block()`.\n');
  });

  it("heads a project's own object directive too, its signature in code; an admonition it labels", () => {
    const page = ['.. genex:: $<CONFIG>', '', '   The build configuration.', '', '.. warning::', '   Mind it.', ''].join('\n');
    assert.equal(rstToMarkdown(page), '# `$<CONFIG>`\n\nThe build configuration.\n\nWarning: Mind it.\n');
  });

  it("reads nothing of a project's own directive without content: its text is written at build time", () => {
    const page = ['Usage', '=====', '', '.. pip-command-usage:: cache "python -m pip"', '', '.. pip-command-options:: cache', '', 'Run it.', ''].join('\n');
    assert.equal(rstToMarkdown(page), '# Usage\n\nRun it.\n');
  });

  it('reads a table of contents as the list of links it shows', () => {
    const page = ['.. toctree::', '   :maxdepth: 1', '', '   /generator/Ninja', '   Visual Studio <vs>', ''].join('\n');
    assert.equal(rstToMarkdown(page), '- [Ninja](/generator/Ninja)\n- [Visual Studio](vs)\n');
  });

  it('reads a definition list as list items of each term and its definition', () => {
    const page = ['The formats are:', '', '``HEXADECIMAL``', '  Notation as in C.', '``DECIMAL``', '  The default,', '  when none is given.', ''].join('\n');
    assert.equal(rstToMarkdown(page), 'The formats are:\n\n- `HEXADECIMAL`: Notation as in C.\n\n- `DECIMAL`: The default,\nwhen none is given.\n');
    assert.equal(rstToMarkdown('* a bullet\n  continued\n'), '* a bullet\ncontinued\n', 'a list item continued is no term');
  });

  it('is read by loadCorpus with its headings, beside Markdown', async () => {
    assert.equal(isRstFile('docs/index.rst'), true);
    assert.equal(isRstFile('notes.md'), false);
    const dir = await mkdtemp(join(tmpdir(), 'sluice-rst-'));
    try {
      await writeFile(join(dir, 'guide.rst'), PAGE);
      const passages = await loadCorpus(dir);
      const timeout = passages.find((p) => p.text.includes('default timeout'));
      assert.equal(timeout?.source, 'guide.rst › Introduction');
      assert.ok(passages.some((p) => p.source === 'guide.rst › Usage' && p.text.includes('```python')));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('turns any text into Markdown whose fences all close, without an error (property)', () => {
    const line = fc.oneof(
      fc.constantFrom(
        '',
        '====',
        '----',
        '~~~~',
        '::',
        'Title',
        '.. note::',
        '.. code-block:: js',
        '.. _x:',
        '..',
        '   indented',
        'text::',
        '``a``',
        ':ref:`x <y>`',
      ),
      fc.string({ maxLength: 12 }).map((s) => s.replace(/`{3,}/g, '``')),
    );
    fc.assert(
      fc.property(fc.array(line, { maxLength: 30 }), (lines) => {
        const markdown = rstToMarkdown(lines.join('\n'));
        const fences = markdown.split('\n').filter((l) => l.startsWith('```')).length;
        assert.equal(fences % 2, 0);
      }),
      { numRuns: 300 },
    );
  });
});
