/**
 * HTML pages in a corpus (src/ai/rag/html-document.ts, corpus.ts): the main content read as
 * Markdown, page furniture left out, code blocks as their text, and any input, however broken,
 * read without an error.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { loadCorpus } from '../../src/ai/rag/corpus.js';
import type { CorpusSkip } from '../../src/ai/rag/document-text.js';
import { NodeHtmlMarkdown } from 'node-html-markdown';
import { htmlToMarkdown } from '../../src/ai/rag/html-document.js';

/** A documentation page as generators write them: navigation around a main element, highlighted code in two variants, permalinks, a script. */
const PAGE = `<!doctype html>
<html><head><title>Timers | Docs</title><style>body { color: red }</style><script>track('visit')</script></head>
<body>
  <header><a href="/">Home</a> <nav><a href="/a.html">Sidebar link</a></nav></header>
  <div id="content">
    <div role="navigation"><ul><li><a href="/b.html">Another page</a></li></ul></div>
    <div role="main">
      <h2>setTimeout(callback, delay)<a class="mark" href="#settimeout">#</a></h2>
      <p>When <code>delay</code> is larger than <code>2147483647</code>, it is set to <code>1</code>. See <a href="https://example.com/x_y">the ERR_OUT_OF_RANGE notes</a>.</p>
      <pre><input type="checkbox"><code class="language-js mjs"><span class="hljs-keyword">import</span> { setTimeout } <span class="hljs-keyword">from</span> 'node:timers';</code><code class="language-js cjs"><span class="hljs-keyword">const</span> { setTimeout } = require('node:timers');</code><button>copy</button></pre>
      <table><tr><th>Option</th><th>Default</th></tr><tr><td>delay</td><td>1</td></tr></table>
      <span aria-hidden="true">decorative</span>
    </div>
  </div>
  <footer>Copyright footer</footer>
</body></html>`;

describe('an HTML page in a corpus', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'sluice-html-'));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  it('reads the main element as Markdown: headings, prose, one code block per variant set, a table; nothing around it', async () => {
    const markdown = await htmlToMarkdown(PAGE);
    assert.match(markdown, /^# Timers \| Docs\n/, 'the title heads a page without an h1');
    assert.match(markdown, /^## setTimeout\(callback, delay\)$/m, 'the heading, without its permalink');
    assert.match(markdown, /larger than `2147483647`, it is set to `1`\. See the ERR_OUT_OF_RANGE notes\./, 'prose, link text kept, its target and no escapes');
    assert.match(
      markdown,
      /```\nimport \{ setTimeout \} from 'node:timers';\n\nconst \{ setTimeout \} = require\('node:timers'\);\n```/,
      'the code variants as one block of text',
    );
    assert.match(markdown, /\| delay +\| 1 +\|/, 'the table');
    for (const furniture of ['Sidebar link', 'Another page', 'Home', 'Copyright', 'track(', 'color: red', 'copy', 'decorative', 'example.com'])
      assert.ok(!markdown.includes(furniture), `${furniture} is not the page's content`);
  });

  it('keeps a line break after inline code as a space: the words on either side stay apart', async () => {
    const markdown = await htmlToMarkdown(
      '<p>dynamic <a href="#x"><code>import()</code></a>\nexpressions load\n<em>modules</em>\n<code>lazily</code>.</p><pre><code>a\nb</code></pre>',
    );
    assert.equal(markdown, 'dynamic `import()` expressions load _modules_ `lazily`.\n\n```\na\nb\n```');
  });

  it('translates a long page in pieces of whole blocks, to the Markdown it translates to whole', async () => {
    const sections = Array.from({ length: 1200 }, (_, i) => `<h2>Part ${i}</h2><p>Step ${i} sets <code>option${i}</code>\nto <em>on</em> and waits.</p>`);
    const page = `<main><div>${sections.join('')}<div>Install it with <code>npm i x</code>\ntoday.</div></div></main>`;
    assert.ok(page.length > 60_000, 'long enough to be cut');
    const whole = new NodeHtmlMarkdown({ maxConsecutiveNewlines: 2, globalEscape: [/(?!)/g, ''] }).translate(page.replaceAll('\n', ' ')).trim();
    const pieces = await htmlToMarkdown(page);
    assert.equal(pieces, whole);
    assert.match(pieces, /^## Part 1199\n\nStep 1199 sets `option1199` to _on_ and waits\.\n\nInstall it with `npm i x` today\.$/m);
  });

  it('without a main element, reads the body without its navigation, header and footer; an h1 needs no title', async () => {
    const markdown = await htmlToMarkdown(
      '<title>T</title><body><nav>Menu</nav><header>Banner</header><h1>Guide</h1><p>Install it with <code>npm i x</code>.</p><aside>Ad</aside><footer>Foot</footer></body>',
    );
    assert.equal(markdown, '# Guide\n\nInstall it with `npm i x`.');
  });

  it('loadCorpus cites .html and .htm pages by path and chunks them under their headings', async () => {
    await writeFile(join(dir, 'timers.html'), PAGE);
    await writeFile(join(dir, 'old.HTM'), '<p>Plain old page about tides.</p>');
    await writeFile(join(dir, 'notes.md'), '# Notes\n\nA Markdown page beside them.\n');
    const skipped: CorpusSkip[] = [];
    const passages = await loadCorpus(dir, { onSkip: (skip) => skipped.push(skip) });
    assert.deepEqual(skipped, []);
    assert.deepEqual([...new Set(passages.map((p) => p.source.split(' › ')[0]))].sort(), ['notes.md', 'old.HTM', 'timers.html']);
    const prose = passages.find((p) => p.text.includes('2147483647'));
    assert.ok(prose !== undefined, 'the prose is a passage');
    assert.match(prose.source, /^timers\.html › setTimeout\(callback, delay\)$/);
    assert.ok(
      passages.some((p) => p.text.startsWith('```') && p.text.includes("require('node:timers')")),
      'the code block is a passage',
    );
  });

  it('reads a page that is not UTF-8 in the charset it declares, else in the one its bytes show', async () => {
    const latin = await mkdtemp(join(tmpdir(), 'sluice-html-latin1-'));
    try {
      const text = 'Le caf\u00e9 ouvre \u00e0 midi, la cr\u00e8me br\u00fbl\u00e9e est tr\u00e8s bonne.';
      // Each page says it once more (its name), so that none is a copy of another, read once.
      const said = (page: string) => `${text} ${page}.`;
      const body = (meta: string, page: string) => Buffer.from(`<html><head>${meta}</head><body><p>${said(page)}</p></body></html>`, 'latin1');
      await writeFile(join(latin, 'declared.html'), body('<meta charset="iso-8859-1">', 'Un'));
      await writeFile(join(latin, 'http-equiv.htm'), body('<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">', 'Deux'));
      await writeFile(join(latin, 'undeclared.html'), body('', 'Trois'));
      await writeFile(join(latin, 'unknown.html'), body('<meta charset="no-such-charset">', 'Quatre'));
      await writeFile(join(latin, 'notes.txt'), Buffer.from(`${said('Cinq')}\n`, 'latin1'));
      // Shift_JIS: 日本語の文章です。 (a sentence of Japanese), several times.
      const sentence = [0x93, 0xfa, 0x96, 0x7b, 0x8c, 0xea, 0x82, 0xcc, 0x95, 0xb6, 0x8f, 0xcd, 0x82, 0xc5, 0x82, 0xb7, 0x81, 0x42];
      await writeFile(join(latin, 'japanese.txt'), Buffer.from([...sentence, ...sentence, ...sentence, ...sentence]));
      await writeFile(join(latin, 'noise.txt'), Buffer.from(Array.from({ length: 256 }, (_, i) => ((i * 97) % 255) + 1)));
      const skipped: CorpusSkip[] = [];
      const passages = await loadCorpus(latin, { onSkip: (skip) => skipped.push(skip) });
      assert.deepEqual(passages.map((p) => [p.source, p.text]).sort(), [
        ['declared.html', said('Un')],
        ['http-equiv.htm', said('Deux')],
        ['japanese.txt', '日本語の文章です。'.repeat(4)],
        ['notes.txt', said('Cinq')],
        ['undeclared.html', said('Trois')],
        ['unknown.html', said('Quatre')],
      ]);
      assert.deepEqual(
        skipped.map((skip) => [skip.file, skip.reason]),
        [['noise.txt', 'not-utf8']],
      );
    } finally {
      await rm(latin, { recursive: true, force: true });
    }
  });

  it('reads any text as HTML without an error: broken markup, stray brackets, entities (property)', async () => {
    const fragment = fc.constantFrom(
      '<p>',
      '</p>',
      '<pre>',
      '</pre>',
      '<code>',
      '<a href="#">',
      '#',
      '</a>',
      '<main>',
      '<h2>',
      '</h2>',
      '&amp;',
      '&lt;',
      '<',
      '>',
      '<!--',
      '-->',
      'text',
      '\n',
      '<script>',
      '<table><tr><td>',
      '`',
    );
    await fc.assert(
      fc.asyncProperty(fc.array(fc.oneof(fragment, fc.string()), { maxLength: 30 }), async (parts) => {
        const markdown = await htmlToMarkdown(parts.join(''));
        assert.equal(typeof markdown, 'string');
      }),
      { numRuns: 200 },
    );
  });
});
