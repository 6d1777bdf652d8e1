import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { adocToMarkdown, isAdocFile } from '../../src/ai/rag/adoc-document.js';
import { loadCorpus } from '../../src/ai/rag/corpus.js';

const PAGE = [
  '= MyLib Guide',
  ':toc:',
  '',
  'MyLib reads files. See link:https://x.org[the docs] and <<install,Install>>; it serves `+*.war+` files at +http://localhost:8080+.',
  '',
  '== Install',
  '',
  '[source,shell]',
  '----',
  'npm install mylib',
  '----',
  '',
  'NOTE: The default timeout is 30 seconds.',
  '',
  '=== Options',
  '',
  '.Settings',
  '|===',
  '|Name |Default |Meaning',
  '',
  '|timeout',
  '|30',
  '|seconds to wait',
  '|retries |2 |attempts after the first',
  '|===',
  '',
  '* `timeout`: seconds to wait.',
  '** nested item',
  '. first step',
  '',
  'timeout:: how long to wait',
  '',
  '// a comment',
  '////',
  'a comment block',
  '////',
  '',
  '====',
  'Example paragraph inside.',
  '====',
  '',
  '....',
  'literal text',
  '....',
].join('\n');

describe('an AsciiDoc page in a corpus', () => {
  it('reads section titles as headings, listing and literal blocks as fences, tables as rows', () => {
    const markdown = adocToMarkdown(PAGE);
    assert.deepEqual(
      markdown.split('\n').filter((line) => line.startsWith('#')),
      ['# MyLib Guide', '## Install', '### Options'],
    );
    assert.match(markdown, /```shell\nnpm install mylib\n```/);
    assert.match(markdown, /```\nliteral text\n```/);
    assert.match(
      markdown,
      /Settings:\n\| Name \| Default \| Meaning \|\n\| --- \| --- \| --- \|\n\| timeout \| 30 \| seconds to wait \|\n\| retries \| 2 \| attempts after the first \|/,
    );
  });

  it('keeps prose, lists and examples; links as their text; attributes and comments say nothing', () => {
    const markdown = adocToMarkdown(PAGE);
    assert.match(markdown, /MyLib reads files\. See the docs and Install; it serves `\*\.war` files at `http:\/\/localhost:8080`\./);
    assert.match(markdown, /NOTE: The default timeout is 30 seconds\./);
    assert.match(markdown, /- `timeout`: seconds to wait\.\n {2}- nested item\n1\. first step/);
    assert.match(markdown, /timeout: how long to wait/);
    assert.match(markdown, /Example paragraph inside\./);
    for (const gone of ['toc', 'comment', '////', '====', '[source', 'link:', '<<']) assert.ok(!markdown.includes(gone), gone);
  });

  it('is read by loadCorpus with its headings', async () => {
    assert.equal(isAdocFile('docs/modules/ROOT/pages/index.adoc'), true);
    assert.equal(isAdocFile('key.asc'), false);
    const dir = await mkdtemp(join(tmpdir(), 'sluice-adoc-'));
    try {
      await writeFile(join(dir, 'guide.adoc'), PAGE);
      const passages = await loadCorpus(dir);
      assert.equal(passages.find((p) => p.text.includes('default timeout'))?.source, 'guide.adoc › Install');
      assert.ok(passages.some((p) => p.source === 'guide.adoc › Options' && /^Settings:\n+\| Name/.test(p.text) && p.text.includes('| retries | 2 |')));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('turns any text into Markdown whose fences all close, without an error (property)', () => {
    const line = fc.oneof(
      fc.constantFrom('', '----', '....', '====', '|===', '////', '--', '[source,js]', '== Title', '.Title', '* item', '+', 'term:: def', ':attr: x', '|a |b'),
      fc.string({ maxLength: 12 }).map((s) => s.replace(/`{3,}/g, '``')),
    );
    fc.assert(
      fc.property(fc.array(line, { maxLength: 30 }), (lines) => {
        const markdown = adocToMarkdown(lines.join('\n'));
        assert.equal(markdown.split('\n').filter((l) => l.startsWith('```')).length % 2, 0);
      }),
      { numRuns: 300 },
    );
  });
});
