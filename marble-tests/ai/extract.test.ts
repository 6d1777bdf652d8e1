/** Extractive answers (src/ai/rag/extract.ts): sentences out of passages, ranked, cited, in reading order. */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { cosineSimilarity } from '../../src/cache/semantic.js';
import { NO_ANSWER, answerPieces, candidatesOf, composeAnswer, cosinesTo, sentencesOf } from '../../src/ai/rag/extract.js';
import type { RetrievedPassage } from '../../src/ai/rag/passage.js';

const v = (...xs: number[]) => Float32Array.from(xs);

describe('extractive answers', () => {
  it('splits prose into sentences, leaving out headings, list markers, separators and lone fragments', () => {
    const text =
      '# Title\nA stage asks for more only with room. `fail` errors with `OverflowError`. `conflate` merges them into one.\n```ts\ncode();\n```\n| a | b |\n- A list item that is long enough.\n\nToo short.';
    assert.deepEqual(sentencesOf(text), [
      'A stage asks for more only with room.',
      '`fail` errors with `OverflowError`.',
      '`conflate` merges them into one.',
      'a; b',
      'A list item that is long enough.',
    ]);
  });

  it('joins a fragment to the sentence before it in its block: an option keeps its default', () => {
    const text =
      '- **maxRetries** `number` (optional) - Maximum number of retries. Default: `5`\n- **statusCodes** `number[]` - Status codes to retry. Default: `[429, 500, 502]`';
    assert.deepEqual(sentencesOf(text), [
      '**maxRetries** `number` (optional) - Maximum number of retries. Default: `5`',
      '**statusCodes** `number[]` - Status codes to retry. Default: `[429, 500, 502]`',
    ]);
  });

  it("quotes an option's attribute list as one piece, under its heading: alone each item is a fragment", () => {
    const text =
      '* Default: 2\n* Type: Number\n\nThe retries config for fetching packages from the registry.\n\n* A list item that is long enough.\n* Too short\n\n- Note: a colon in a longer item is prose, not an attribute of anything.\n\nType: `boolean`\\\nDefault: `false`';
    assert.deepEqual(sentencesOf(text), [
      'Default: 2; Type: Number',
      'The retries config for fetching packages from the registry.',
      'A list item that is long enough.',
      'Note: a colon in a longer item is prose, not an attribute of anything.',
      'Type: `boolean`; Default: `false`',
    ]);
    const passages: RetrievedPassage[] = [
      { id: 'c#1', text: '* Default: 2\n* Type: Number', source: 'config.md › fetch-retries', headings: 'Config › fetch-retries', score: 1 },
    ];
    const answer = composeAnswer(v(1, 0), passages, candidatesOf(passages), [v(1, 0)], { sentences: 1, context: 0 });
    assert.equal(answer.text.split('\n\n')[0], 'fetch-retries: Default: 2; Type: Number [1]');
  });

  it('quotes a list of short items as one piece, with a short lead-in ending in a colon; never a list of links alone', () => {
    const sampler =
      'Optional parameters:\n\n- `remoteParentSampled(Sampler)` (default: `AlwaysOn`)\n- `remoteParentNotSampled(Sampler)` (default: `AlwaysOff`)';
    assert.deepEqual(sentencesOf(sampler), [
      'Optional parameters: `remoteParentSampled(Sampler)` (default: `AlwaysOn`); `remoteParentNotSampled(Sampler)` (default: `AlwaysOff`)',
    ]);
    assert.deepEqual(sentencesOf('- `reset`\n- `bold`\n- `dim`\n\nStyles nest inside each other freely.'), [
      '`reset`; `bold`; `dim`',
      'Styles nest inside each other freely.',
    ]);
    const long = Array.from({ length: 40 }, (_, i) => `- \`colour${i}Bright\``).join('\n');
    assert.ok(sentencesOf(long).every((piece) => piece.length <= 240) && sentencesOf(long).length > 1, 'a long list in pieces');
    assert.deepEqual(
      sentencesOf('* [API ⇗](/docs/api.md)\n* [Browser API ⇗](/docs/browser.md)\n* See [`logger.level`](#level)\n* See [`redact`](#redact)'),
      [],
    );
    assert.deepEqual(sentencesOf('* Lonely\n\nA lead-in alone:\n\nA real sentence that is long enough.'), ['A real sentence that is long enough.']);
  });

  it('a sentence ending in a colon takes the list items after it, while it stays short', () => {
    const text =
      '**Network log** - Complete network activity:\n- All HTTP requests and responses\n- Timing (DNS, TTFB)\n\nThe trace also holds the console log.';
    assert.deepEqual(sentencesOf(text), [
      '**Network log** - Complete network activity: All HTTP requests and responses; Timing (DNS, TTFB)',
      'The trace also holds the console log.',
    ]);
    const long = `The constructor takes these arguments:\n${Array.from({ length: 12 }, (_, i) => `- **option${i}** \`number\` - the ${i}th option of the call.`).join('\n')}`;
    const sentences = sentencesOf(long);
    assert.ok(sentences[0]!.startsWith('The constructor takes these arguments: **option0**') && sentences[0]!.length <= 240, sentences[0]);
    assert.ok(sentences.includes('**option11** `number` - the 11th option of the call.'), 'the items past the bound are quoted alone');
  });

  it('an item that opens with a name in code is quoted whole, its default with its name; a long one or an unnamed one by sentence', () => {
    const long = `\`maxmem\` ${'Memory upper bound of the derivation. '.repeat(6)}**Default:** \`33554432\`.`;
    const text = [
      '* `cost` {number} CPU/memory cost parameter. Must be a power of two greater than one. **Default:** `16384`.',
      `* ${long}`,
      '* The salt should be unique. Use random bytes for it.',
    ].join('\n');
    const pieces = sentencesOf(text);
    assert.equal(pieces[0], '`cost` {number} CPU/memory cost parameter. Must be a power of two greater than one. **Default:** `16384`.');
    assert.ok(pieces.length > 4 && !pieces.includes(long), 'past 240 characters, an item is quoted by sentence');
    assert.deepEqual(pieces.slice(-2), ['The salt should be unique.', 'Use random bytes for it.']);
  });

  it('an item that only names a thing takes the items nested under it, or lends them its name past the bound', () => {
    const text = [
      '* `BROTLI_PARAM_QUALITY`',
      '  * Ranges from `0` to `11`, with a default of `11`.',
      '* `BROTLI_PARAM_MODE`',
      '  * `BROTLI_MODE_GENERIC` (default)',
      '  * `BROTLI_MODE_TEXT`, adjusted for UTF-8 text',
      '',
      'The flags are set at construction.',
      '',
      '* a plain item of several words',
      '  * nested under prose, it stands alone',
    ].join('\n');
    assert.deepEqual(sentencesOf(text), [
      '`BROTLI_PARAM_QUALITY`: Ranges from `0` to `11`, with a default of `11`.',
      '`BROTLI_PARAM_MODE`: `BROTLI_MODE_GENERIC` (default); `BROTLI_MODE_TEXT`, adjusted for UTF-8 text',
      'The flags are set at construction.',
      'a plain item of several words',
      'nested under prose, it stands alone',
    ]);
    const long = ['* `level`', ...Array.from({ length: 8 }, (_, i) => `  * Level ${i} writes every message of severity ${i} and above to the sink.`)].join(
      '\n',
    );
    const pieces = sentencesOf(long);
    assert.ok(pieces[0]!.startsWith('`level`: Level 0 writes') && pieces[0]!.length <= 240, pieces[0]);
    assert.ok(pieces.includes('`level`: Level 7 writes every message of severity 7 and above to the sink.'), pieces.join('\n'));
  });

  it('a sentence ending in a colon takes the code lines after it in its fence, while it stays short', () => {
    const text = [
      'These settings keep the socket open for only 10ms:',
      '```js',
      "import { Agent } from 'undici'",
      'const agent = new Agent({',
      '  keepAliveTimeout: 10,',
      '  keepAliveMaxTimeout: 10',
      '})',
      '```',
      '```js',
      'setGlobalDispatcher(agent)',
      '```',
    ].join('\n');
    assert.deepEqual(sentencesOf(text), [
      "These settings keep the socket open for only 10ms: `import { Agent } from 'undici'` `const agent = new Agent({ keepAliveTimeout: 10, keepAliveMaxTimeout: 10 })`",
      '`setGlobalDispatcher(agent)`',
    ]);
    const steps = Array.from({ length: 12 }, (_, i) => `npx tool step-${i} --verbose`).join('\n');
    const sentences = sentencesOf(`The setup needs a few commands to run:\n\`\`\`sh\n${steps}\n\`\`\``);
    assert.ok(sentences[0]!.startsWith('The setup needs a few commands to run: `npx tool step-0 --verbose`') && sentences[0]!.length <= 240, sentences[0]);
    assert.ok(sentences.includes('`npx tool step-11 --verbose`'), 'the lines past the bound are quoted alone');
  });

  it('quotes a call or literal spread over lines as one statement while short, its comments before it', () => {
    const text = [
      '```js',
      '// refresh five minutes early',
      'const token = await getToken({',
      '  bufferMs: 5 * 60 * 1000, // in ms, see (below)',
      '});',
      'const big = {',
      ...Array.from({ length: 20 }, (_, i) => `  option${i}: 'a value of some length',`),
      '};',
      '```',
    ].join('\n');
    const sentences = sentencesOf(text);
    assert.equal(sentences[0], '`// refresh five minutes early` `// in ms, see (below)` `const token = await getToken({ bufferMs: 5 * 60 * 1000, });`');
    // Past the bound, each line is quoted alone as before.
    assert.equal(sentences[1], '`const big = {`');
    assert.equal(sentences[2], "`option0: 'a value of some length',`");
  });

  it('quotes the comment lines of a code block with the line they describe, and no comment alone', () => {
    const text =
      '```bash\n# List every action\nnpx trace actions\n\n# failed actions only,\n# by default in one line\nnpx trace actions --errors-only\n# a trailing comment\n```';
    assert.deepEqual(sentencesOf(text), [
      '`# List every action` `npx trace actions`',
      '`# failed actions only,` `# by default in one line` `npx trace actions --errors-only`',
    ]);
    const banner = `\`\`\`js\n${Array.from({ length: 9 }, (_, i) => `// line ${i} of a long banner`).join('\n')}\nrun(options);\n\`\`\``;
    assert.deepEqual(sentencesOf(banner), [
      '`// line 5 of a long banner` `// line 6 of a long banner` `// line 7 of a long banner` `// line 8 of a long banner` `run(options);`',
    ]);
  });

  it('quotes a code line as a code span and a table row with its header, in reading order', () => {
    const text = [
      'Install it first:',
      '```sh',
      '# comment',
      'npm install rxjs',
      '}',
      '```',
      '| Scheduler | Runs work |',
      '| --- | :---: |',
      '| asapScheduler | on the microtask queue |',
      '| asyncScheduler | with setTimeout |',
      'Then the prose goes on for a while.',
    ].join('\n');
    assert.deepEqual(sentencesOf(text), [
      'Install it first: `npm install rxjs`',
      'Scheduler: asapScheduler; Runs work: on the microtask queue',
      'Scheduler: asyncScheduler; Runs work: with setTimeout',
      'Then the prose goes on for a while.',
    ]);
  });

  it('ranks sentences by the words they share with the question as well as by cosine, dropping those under half the best', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: 'Install with npm first.\n```\nnpm install rxjs\n```', source: 'a.md › Install', headings: 'Guide › Install', score: 1 },
    ];
    const candidates = candidatesOf(passages);
    assert.deepEqual(
      candidates.map((c) => c.text),
      ['Install with npm first.', '`npm install rxjs`'],
    );
    const question = v(1, 0);
    // By cosine alone the prose wins; the code line holds the rare word the question asks for.
    const vectors = [v(0.9, 0.44), v(0.6, 0.8)];
    const weights: Record<string, number> = { install: 1, rxjs: 3 };
    const words = { terms: ['install', 'rxjs'], weight: (t: string) => weights[t] ?? 0, termsOf: (t: string) => t.toLowerCase().match(/[a-z]+/g) ?? [] };
    assert.match(composeAnswer(question, passages, candidates, vectors, { sentences: 1 }).text, /^Install with npm first\. \[1\]/);
    assert.match(composeAnswer(question, passages, candidates, vectors, { sentences: 1 }, words).text, /^`npm install rxjs` \[1\]/);
  });

  it('leaves out link reference definitions and never ends a sentence at e.g., i.e. or inside a code span', () => {
    const text =
      'Pass a level name (e.g. `info`) or its number, i.e. 30 for info.\n\n[the full documentation of every option]: https://example.com/docs\n[1]: https://example.com';
    assert.deepEqual(sentencesOf(text), ['Pass a level name (e.g. `info`) or its number, i.e. 30 for info.']);
    assert.deepEqual(sentencesOf('- `nak(millis?: number)` - like ack, but the message is sent again. Then `term()` ends it.'), [
      '`nak(millis?: number)` - like ack, but the message is sent again.',
      'Then `term()` ends it.',
    ]);
  });

  it('never ends a sentence at a question or exclamation mark quoted inside it', () => {
    assert.deepEqual(
      sentencesOf(
        'A question worded otherwise ("How do I wipe the display?" for a page about erasing it) is answered. Each of its words is read for its meaning.',
      ),
      ['A question worded otherwise ("How do I wipe the display?" for a page about erasing it) is answered.', 'Each of its words is read for its meaning.'],
    );
    assert.deepEqual(sentencesOf('It logs "Done!" once the last file is written to disk. Then it exits with code 0.'), [
      'It logs "Done!" once the last file is written to disk.',
      'Then it exits with code 0.',
    ]);
    assert.deepEqual(sentencesOf('Set the [ranges](https://example.com/show_bug.cgi?id=745678) option to keep every range in the output.'), [
      'Set the [ranges](https://example.com/show_bug.cgi?id=745678) option to keep every range in the output.',
    ]);
  });

  it('leaves out images, badges and HTML comments: nothing a reader of the page is told', () => {
    const badges =
      '[![Build Status](https://ci.example.com/x.svg?branch=main)](https://ci.example.com/x) [![npm](https://img.example.com/v/x.svg?style=flat)][npm-url] ![logo](logo.png)';
    assert.deepEqual(sentencesOf(badges), []);
    assert.deepEqual(sentencesOf('It parses every file once. <!-- say why it is fast --> ![diagram](flow.png) Each result is cached by its path.'), [
      'It parses every file once.',
      'Each result is cached by its path.',
    ]);
  });

  it("reads a blockquote's text without its markers or an alert's label, and a prompt in a plain fence as code", () => {
    const quoted = '> [!CAUTION]\n> This includes every tokenizer, which grows the bundle.\n>\n> > ```shell\n> > npx build --lite\n> > ```';
    assert.deepEqual(sentencesOf(quoted), ['This includes every tokenizer, which grows the bundle.', '`npx build --lite`']);
    assert.deepEqual(sentencesOf('```\n> node --version\n```'), ['`> node --version`']);
  });

  it('reads prose and rows without their HTML tags (a code span keeps its own) or the `**` a sentence split left behind', () => {
    assert.deepEqual(sentencesOf('<details>\n<summary>Older versions need the config flag.</summary>\nPass `<b>` to bold a word.\n</details>'), [
      'Older versions need the config flag.',
      'Pass `<b>` to bold a word.',
    ]);
    assert.deepEqual(sentencesOf('| version | node |\n| --- | --- |\n| **4.x** | ≥12.17.0<sup>(1)</sup> |'), ['version: **4.x**; node: ≥12.17.0 (1)']);
    assert.deepEqual(sentencesOf('**Refusals.** Under overload most requests are refused at the door.'), [
      'Under overload most requests are refused at the door.',
    ]);
    assert.deepEqual(sentencesOf('**Cancel reaches the upstream. A client that leaves aborts its request.** Each one is counted.'), [
      'Cancel reaches the upstream.',
      'A client that leaves aborts its request.',
      'Each one is counted.',
    ]);
  });

  it('quotes a sentence once, and a lone code line only when it holds more than the prose around it', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: '```js\nimport { Server } from "ws";\n```\nCompression is disabled by default on the server.', source: 'a.md › Server', score: 1 },
      { id: 'b', text: 'Compression is disabled by default on the server.', source: 'b.md › Server', score: 0.9 },
    ];
    const candidates = candidatesOf(passages);
    const weights: Record<string, number> = { server: 1, compression: 3, default: 1 };
    const words = {
      terms: ['server', 'compression', 'default'],
      weight: (t: string) => weights[t] ?? 0,
      termsOf: (t: string) => t.toLowerCase().match(/[a-z]+/g) ?? [],
    };
    // The import line is as close by cosine and shares "server": weighed down, it falls under half the best.
    const answer = composeAnswer(v(1, 0), passages, candidates, [v(0.8, 0.6), v(0.8, 0.6), v(0.8, 0.6)], { sentences: 3 }, words);
    assert.equal(answer.text.split('\n\n')[0], 'Compression is disabled by default on the server. [1]');
    // A comment quoted with its line is code all the same: holding what the prose holds, it yields to the prose…
    const commented = (prose: string): RetrievedPassage[] => [
      {
        id: 'a',
        text: `\`\`\`js\n// server compression default\nnew Server({ perMessageDeflate: false });\n\`\`\`\n${prose}`,
        source: 'a.md › Server',
        score: 1,
      },
    ];
    const first = (prose: string) => {
      const pieces = candidatesOf(commented(prose));
      assert.equal(pieces[0]!.text, '`// server compression default` `new Server({ perMessageDeflate: false });`');
      return composeAnswer(v(1, 0), commented(prose), pieces, [v(0.8, 0.6), v(0.8, 0.6)], { sentences: 1 }, words).text.split('\n\n')[0];
    };
    assert.equal(first('The server disables compression by default.'), 'The server disables compression by default. [1]');
    // …and holding a query word the prose lacks, it is the answer.
    assert.equal(first('Compression is disabled by default here.'), '`// server compression default` `new Server({ perMessageDeflate: false });` [1]');
  });

  it('never quotes a code line that says only what the question says: the pasted error, the import it asks about', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: '```rust\nuse std::sync::mpsc;\n```\nThe name stands for multiple producer, single consumer.', source: 'a.md › Channels', score: 1 },
    ];
    const weights: Record<string, number> = { mpsc: 4, std: 1, sync: 1, mean: 1 };
    // Stop words (`use`) are no terms, as `lexicalTerms` reads them.
    const termsOf = (t: string) => (t.toLowerCase().match(/[a-z]+/g) ?? []).filter((w) => !['use', 'the', 'for'].includes(w));
    const words = { terms: ['mean', 'std', 'sync', 'mpsc'], weight: (t: string) => weights[t] ?? 0, termsOf };
    const candidates = candidatesOf(passages);
    assert.deepEqual(
      candidates.map((c) => c.text),
      ['`use std::sync::mpsc;`', 'The name stands for multiple producer, single consumer.'],
    );
    const answer = composeAnswer(v(1, 0), passages, candidates, [v(1, 0), v(0.6, 0.8)], { sentences: 2, minScore: 0 }, words);
    assert.equal(answer.text.split('\n\n')[0], 'The name stands for multiple producer, single consumer. [1]');
    // A code line with a word of its own (`channel`) is no echo.
    const more: RetrievedPassage[] = [{ ...passages[0]!, text: passages[0]!.text.replace('use std::sync::mpsc;', 'let (tx, rx) = mpsc::channel();') }];
    assert.match(composeAnswer(v(1, 0), more, candidatesOf(more), [v(1, 0), v(0.6, 0.8)], { sentences: 2, minScore: 0 }, words).text, /mpsc::channel/);
  });

  it('picks the closest sentences above the threshold, writes them in reading order with their source numbers, then the sources', () => {
    const passages: RetrievedPassage[] = [
      { id: 'a', text: 'First one here now. Second one here now.', source: 'a.md › A', score: 0.9 },
      { id: 'b', text: 'Third one here now.', source: 'b.md › B', score: 0.8 },
    ];
    const candidates = candidatesOf(passages);
    assert.deepEqual(
      candidates.map((c) => [c.passage, c.position]),
      [
        [0, 0],
        [0, 1],
        [1, 0],
      ],
    );
    const question = v(1, 0);
    // Third closest, then second; first below the threshold.
    const answer = composeAnswer(question, passages, candidates, [v(0, 1), v(0.6, 0.8), v(1, 0.1)], { sentences: 3, minScore: 0.5 });
    assert.equal(answer.text, 'Second one here now. [1] Third one here now. [2]\n\nSources:\n[1] a.md › A\n[2] b.md › B');
    assert.deepEqual(
      answer.sources.map((s) => s.id),
      ['a', 'b'],
    );
    assert.deepEqual(composeAnswer(question, passages, candidates, [v(0, 1), v(0, 1), v(0, 1)]), { text: NO_ANSWER, sources: [] });
    assert.deepEqual(composeAnswer(question, [], [], []), { text: NO_ANSWER, sources: [] });
  });

  it('streams an answer as words with their following space, losing nothing', () => {
    const text = 'One two [1]\n\nSources:\n[1] a.md';
    assert.equal(answerPieces(text).join(''), text);
    assert.deepEqual(answerPieces('a b'), ['a ', 'b']);
  });

  it('cosinesTo gives cosineSimilarity of the question with each vector, to the last bit (property)', () => {
    const vector = (dim: number) => fc.float32Array({ minLength: dim, maxLength: dim, noDefaultInfinity: true, noNaN: true, min: -4, max: 4 });
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 24 }).chain((dim) => fc.tuple(vector(dim), fc.array(vector(dim), { maxLength: 6 }))),
        ([question, vectors]) => {
          const cosines = cosinesTo(question, vectors);
          assert.equal(cosines.length, vectors.length);
          vectors.forEach((v, i) => assert.ok(Object.is(cosines[i], cosineSimilarity(question, v)), `${cosines[i]} ≠ ${cosineSimilarity(question, v)}`));
          assert.deepEqual(cosinesTo(question, vectors, Math.min(1, vectors.length)), cosines.slice(0, 1));
        },
      ),
      { numRuns: 300 },
    );
  });
});
