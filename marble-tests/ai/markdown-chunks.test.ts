/** Markdown cut into passages that carry their heading path (src/ai/rag/markdown-chunks.ts). */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { chunkMarkdown } from '../../src/ai/rag/markdown-chunks.js';

const shape = (markdown: string, file = 'doc.md') => chunkMarkdown(markdown, file).map((p) => [p.source, p.headings ?? '', p.text]);

describe('chunkMarkdown', () => {
  it('gives each passage its heading path; front matter is the title, never a passage', () => {
    const doc = [
      '---',
      'title: "Name resolution"',
      'tags: [dns]',
      '---',
      '',
      '# DNS',
      '',
      'Resolvers cache answers.',
      '',
      '## Records',
      '',
      '### A',
      '',
      'Maps a name to IPv4.',
      '',
      '## Lookups',
      '',
      'Use dig.',
    ].join('\n');
    assert.deepEqual(shape(doc), [
      ['doc.md › DNS', 'Name resolution › DNS', 'Resolvers cache answers.'],
      ['doc.md › A', 'Name resolution › DNS › Records › A', 'Maps a name to IPv4.'],
      ['doc.md › Lookups', 'Name resolution › DNS › Lookups', 'Use dig.'],
    ]);
  });

  it('a heading keeps what a reader sees: badges, logos and HTML tags go, links keep their text', () => {
    const doc = [
      '# Prometheus client [![Actions Status](https://ci.example/badge.svg?branch=master)](https://ci.example/actions)',
      '## define-properties <sup>[![Version Badge][npm-version-svg]][package-url]</sup> ![logo](logo.png)',
      '### The `pino` [API](api.md) and [Usage][usage-link]',
      'Some text for the passage.',
    ].join('\n');
    const [passage] = chunkMarkdown(doc, 'README.md');
    assert.equal(passage!.headings, 'Prometheus client › define-properties › The pino API and Usage');
    assert.equal(passage!.source, 'README.md › The pino API and Usage');
  });

  it('a heading keeps a code span as written: `<...>` in code is no HTML tag', () => {
    const doc = ['# Expressions', '## `$<TARGET_FILE:tgt>` and <sup>note</sup>', 'Text.'].join('\n');
    assert.equal(chunkMarkdown(doc, 'a.md')[0]!.headings, 'Expressions › $<TARGET_FILE:tgt> and note');
  });

  it('a heading loses its emphasis marks, but never the underscores of a name', () => {
    const doc = ['# add_custom_command', '## `NODE_DEBUG_NATIVE=module`', '### The *new* and __strong__ _way_ with `a_*b*_c`', 'Text.'].join('\n');
    assert.equal(chunkMarkdown(doc, 'a.md')[0]!.headings, 'add_custom_command › NODE_DEBUG_NATIVE=module › The new and strong way with a_*b*_c');
  });

  it('a paragraph that only names what follows (a code name, bold words) heads it, until the next one or a heading', () => {
    const doc = [
      '## HTTP',
      '',
      '`http.client.request.start`',
      '',
      '* `request` {http.ClientRequest}',
      '',
      'Emitted when a client starts a request.',
      '',
      '`http.client.request.error`',
      '',
      'Emitted when a request fails.',
      '',
      '**Example**',
      '',
      'Subscribe to both.',
      '',
      '## Install',
      '',
      '`npm install rxjs`',
      '',
      '**Only valid for a client request.**',
    ].join('\n');
    assert.deepEqual(shape(doc), [
      ['doc.md › http.client.request.start', 'HTTP › http.client.request.start', '* `request` {http.ClientRequest}'],
      ['doc.md › http.client.request.start', 'HTTP › http.client.request.start', 'Emitted when a client starts a request.'],
      ['doc.md › http.client.request.error', 'HTTP › http.client.request.error', 'Emitted when a request fails.'],
      ['doc.md › Example', 'HTTP › Example', 'Subscribe to both.'],
      // A command and a sentence in bold are what the section says, not names of what follows.
      ['doc.md › Install', 'Install', '`npm install rxjs`'],
      ['doc.md › Install', 'Install', '**Only valid for a client request.**'],
    ]);
  });

  it('a horizontal rule only separates; setext underlines are headings', () => {
    const doc = ['Guide', '=====', '', 'First part.', '', '---', '', 'Second part.', '***', 'Third part.', '', 'Install', '-------', '', 'Run it.'].join('\n');
    assert.deepEqual(shape(doc), [
      ['doc.md › Guide', 'Guide', 'First part.'],
      ['doc.md › Guide', 'Guide', 'Second part.'],
      ['doc.md › Guide', 'Guide', 'Third part.'],
      ['doc.md › Install', 'Guide › Install', 'Run it.'],
    ]);
  });

  it('an HTML comment over several paragraphs is one block, none of its lines prose; an unclosed one is only its paragraph', () => {
    const doc = [
      '# API',
      '',
      '<!-- YAML',
      'changes:',
      '',
      '  - version: v19.0.0',
      '    description: Removed.',
      '-->',
      '',
      'Reads a file.',
      '',
      '<!-- never closed',
      '',
      'Writes a file.',
    ].join('\n');
    assert.deepEqual(shape(doc), [
      ['doc.md › API', 'API', '<!-- YAML\nchanges:\n\n  - version: v19.0.0\n    description: Removed.\n-->'],
      ['doc.md › API', 'API', 'Reads a file.'],
      ['doc.md › API', 'API', '<!-- never closed'],
      ['doc.md › API', 'API', 'Writes a file.'],
    ]);
    const long = chunkMarkdown(`<!-- notes\n${'a line of notes\n'.repeat(200_000)}-->\n\nAfter the notes.`, 'long.md');
    assert.deepEqual(
      long.map((p) => (p.text.length > 100 ? 'the comment' : p.text)),
      ['the comment', 'After the notes.'],
      'a comment of 200,000 lines is one block',
    );
  });

  it('a code fence and a table are passages of their own; a lead-in ending in `:` stays with its block', () => {
    const doc = [
      '# Use',
      'Some prose.',
      '| a | b |',
      '| - | - |',
      '| 1 | 2 |',
      '',
      'Install it:',
      '',
      '```sh',
      'npm install rxjs',
      '',
      '# not a heading',
      '```',
      '',
      '- one',
      '- two',
    ].join('\n');
    assert.deepEqual(shape(doc), [
      ['doc.md › Use', 'Use', 'Some prose.'],
      ['doc.md › Use', 'Use', '| a | b |\n| - | - |\n| 1 | 2 |'],
      ['doc.md › Use', 'Use', 'Install it:\n\n```sh\nnpm install rxjs\n\n# not a heading\n```'],
      ['doc.md › Use', 'Use', '- one\n- two'],
    ]);
  });

  it('cuts a long table into pieces of 12 rows, each under the header', () => {
    const rows = Array.from({ length: 30 }, (_, i) => `| r${i} | v${i} |`);
    const pieces = chunkMarkdown(['| key | value |', '|---|---|', ...rows].join('\n'), 't.md');
    assert.deepEqual(
      pieces.map((p) => p.text.split('\n').length),
      [14, 14, 8],
    );
    for (const piece of pieces) assert.ok(piece.text.startsWith('| key | value |\n|---|---|\n'));
    assert.deepEqual(
      pieces.flatMap((p) => p.text.split('\n').slice(2)),
      rows,
    );
  });

  it('cuts a long list into pieces of whole items, its lead-in with the first; a short list stays whole', () => {
    const items = Array.from({ length: 12 }, (_, i) => `- item ${i} ${'word '.repeat(20).trim()}\n  continued ${i}.`);
    const pieces = chunkMarkdown(['Dependencies:', '', ...items].join('\n'), 'deps.md').map((p) => p.text);
    assert.ok(pieces.length > 1 && pieces[0]!.startsWith('Dependencies:\n\n- item 0 '), pieces[0]);
    assert.deepEqual(pieces.join('\n').replace('Dependencies:\n\n', '').split('\n'), items.join('\n').split('\n'), 'every line once, in order');
    assert.ok(
      pieces.every((piece) => /^(Dependencies:|- item)/.test(piece) && /continued \d+\.$/.test(piece)),
      'no item is cut',
    );
    assert.deepEqual(
      chunkMarkdown('- one\n- two', 'a.md').map((p) => p.text),
      ['- one\n- two'],
    );
  });

  it('plain text is paragraphs, with no headings; ids stay unique', () => {
    fc.assert(
      fc.property(fc.array(fc.stringMatching(/^[a-z][a-z ]{0,20}[a-z.]$/), { minLength: 1, maxLength: 8 }), (paragraphs) => {
        const passages = chunkMarkdown(paragraphs.join('\n\n'), 'notes.txt');
        assert.deepEqual(
          passages.map((p) => p.text),
          paragraphs.map((p) => p.trim()).filter((p) => p !== '' && !p.endsWith(':')),
        );
        assert.ok(passages.every((p) => p.source === 'notes.txt' && p.headings === undefined));
        assert.equal(new Set(passages.map((p) => p.id)).size, passages.length);
      }),
    );
  });
});
