/**
 * Which sentences the extractive answer quotes (src/ai/rag/extract.ts, sentence-scores.ts, sections.ts):
 * sentence-level BM25 with corpus IDF, headings as context, retrieval's first passage preferred, a
 * second passage or a neighbour of a retrieved one when it holds what the answer lacks.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { lastValueFrom, toArray } from 'rxjs';
import { generateRequest } from '../../src/ai/inference/worker.js';
import { ragWorker } from '../../src/ai/pipelines/rag-worker.js';
import { chunkMarkdown, indexPassages } from '../../src/ai/rag/corpus.js';
import { candidatesOf, composeAnswer } from '../../src/ai/rag/extract.js';
import type { RetrievedPassage } from '../../src/ai/rag/passage.js';
import { Sections } from '../../src/ai/rag/sections.js';
import { matchSentences, type QueryTerms } from '../../src/ai/rag/sentence-scores.js';
import { hashingEmbedder } from '../support/hashing-embedder.js';

const v = (...xs: number[]) => Float32Array.from(xs);

/** Query terms with fixed IDFs; a text's terms are its lower-case words, `s` dropped. */
function terms(weights: Record<string, number>): QueryTerms {
  return {
    terms: Object.keys(weights),
    weight: (term) => weights[term] ?? 0,
    termsOf: (text) => (text.toLowerCase().match(/[a-z0-9]+/g) ?? []).map((w) => w.replace(/s$/, '')),
  };
}

const passage = (id: string, text: string, headings = 'Guide', score = 1): RetrievedPassage => ({
  id,
  text,
  source: `${id}.md › ${headings.split(' › ').at(-1)}`,
  headings,
  score,
});

describe('extractive answer selection', () => {
  it('scores a sentence holding more of the rare query words above one repeating a common word', () => {
    const words = terms({ option: 0.3, value: 1, variadic: 5, several: 4 });
    const [repeating, rare] = matchSentences(
      [{ text: 'An option option option value for the option.' }, { text: 'A variadic flag takes several words.' }],
      words,
    );
    assert.ok(rare!.score > repeating!.score, `${rare!.score} > ${repeating!.score}`);
    assert.deepEqual([...rare!.held].sort(), ['several', 'variadic']);
  });

  it('quotes the sentence that states a query word over one that only sits under a heading holding it', () => {
    const passages = [passage('redaction', 'Paths are listed in an array of strings here. Set redact to hide the secret keys.', 'Guide › Redact')];
    const candidates = candidatesOf(passages);
    // By cosine alone the first sentence is closer.
    const answer = composeAnswer(v(1, 0), passages, candidates, [v(1, 0), v(0.8, 0.6)], { sentences: 1, context: 0 }, terms({ redact: 4, secret: 1 }));
    assert.equal(answer.text.split('\n\n')[0], 'Set redact to hide the secret keys. [1]');
  });

  it('quotes what stands before the best sentence only while it speaks of the question, or when the best one points back to it', () => {
    const quote = (text: string) => {
      const passages = [passage('agent', text)];
      const candidates = candidatesOf(passages);
      const words = terms({ agent: 1, retry: 4, attempt: 3 });
      return composeAnswer(
        v(1, 0),
        passages,
        candidates,
        candidates.map(() => v(1, 0)),
        { sentences: 1 },
        words,
      ).text.split('\n\n')[0];
    };
    assert.equal(
      quote('Cancellation runs the other way. The agent drops the step. An agent can retry each attempt three times. It waits a second in between.'),
      'The agent drops the step. [1] An agent can retry each attempt three times. [1] It waits a second in between. [1]',
      'the sentence before holds "agent"; the one before that nothing of the question',
    );
    assert.equal(
      quote('Cancellation runs the other way. Sockets are pooled per origin. They retry each attempt three times. Waits last a second.'),
      'Cancellation runs the other way. [1] Sockets are pooled per origin. [1] They retry each attempt three times. [1] Waits last a second. [1]',
      'the best sentence points back: what it points to is quoted',
    );
  });

  it('quotes the best sentence with up to two sentences of prose before and after it in its passage (context), never its code', () => {
    const passages = [
      passage(
        'pool',
        'A pool opens connections on demand. Each connection is kept alive after a response. The keep-alive timeout defaults to four seconds. Pipelining stays off by default.\n```js\nnew Pool(url, { keepAliveTimeout: 4000 })\n```',
      ),
    ];
    const candidates = candidatesOf(passages);
    const vectors = candidates.map(() => v(1, 0));
    const words = terms({ connection: 2, kept: 3, alive: 3 });
    const body = (context?: number) =>
      composeAnswer(v(1, 0), passages, candidates, vectors, { sentences: 1, ...(context !== undefined && { context }) }, words).text.split('\n\n')[0];
    assert.equal(
      body(),
      'A pool opens connections on demand. [1] Each connection is kept alive after a response. [1] The keep-alive timeout defaults to four seconds. [1] Pipelining stays off by default. [1]',
    );
    assert.equal(
      body(1),
      'A pool opens connections on demand. [1] Each connection is kept alive after a response. [1] The keep-alive timeout defaults to four seconds. [1]',
    );
    assert.equal(body(0), 'Each connection is kept alive after a response. [1]');
    // A table row is a block of its own: the rows beside it are other options, not its context.
    const table = [
      passage(
        'options',
        '| option | default |\n| --- | --- |\n| capacity | 16 buffered elements |\n| sampleRate | 0 timed elements |\n| timeout | none at all |',
      ),
    ];
    const rows = candidatesOf(table);
    assert.deepEqual(new Set(rows.map((r) => r.block)).size, 3);
    const row = composeAnswer(
      v(1, 0),
      table,
      rows,
      rows.map(() => v(1, 0)),
      { sentences: 1 },
      terms({ samplerate: 4 }),
    );
    assert.equal(row.text.split('\n\n')[0], 'option: sampleRate; default: 0 timed elements [1]');
    assert.equal(
      body(2),
      'A pool opens connections on demand. [1] Each connection is kept alive after a response. [1] The keep-alive timeout defaults to four seconds. [1] Pipelining stays off by default. [1]',
    );
  });

  it('quotes the sentence before one that points back to it ("But they…", "Therefore…"), unless it is quoted anyway', () => {
    const passages = [
      passage('summary', 'Summaries track percentiles. The defaults are 0.01, 0.5 and 0.99 here. But they can be overridden by a percentiles array.'),
    ];
    const candidates = candidatesOf(passages);
    const vectors = [v(0, 1), v(0, 1), v(1, 0)];
    const answer = composeAnswer(v(1, 0), passages, candidates, vectors, { sentences: 1, context: 0 }, terms({ overridden: 3, percentile: 1 }));
    assert.equal(answer.text.split('\n\n')[0], 'The defaults are 0.01, 0.5 and 0.99 here. But they can be overridden by a percentiles array. [1]');
    // The sentence before is quoted on its own merit: it is not repeated.
    const both = composeAnswer(v(1, 0), passages, candidates, [v(0, 1), v(1, 0), v(1, 0)], { sentences: 2, context: 0 }, terms({ overridden: 3, default: 3 }));
    assert.equal(both.text.split('\n\n')[0], 'The defaults are 0.01, 0.5 and 0.99 here. [1] But they can be overridden by a percentiles array. [1]');
    // A sentence that points nowhere back, or opens its passage, stands alone.
    const alone = [passage('a', 'Summaries track percentiles. Arrays of percentiles override them.'), passage('b', 'They can be overridden by an array.')];
    const quoted = composeAnswer(
      v(1, 0),
      alone,
      candidatesOf(alone),
      [v(0, 1), v(1, 0), v(1, 0)],
      { sentences: 2, context: 0 },
      terms({ overridden: 3, override: 3 }),
    );
    assert.doesNotMatch(quoted.text.split('\n\n')[0]!, /Summaries/);
  });

  it('quotes the code line just before a passage that opens on "This…", where the code is the passage before it', () => {
    const prose = (text: string) => passage('cli', text, 'Guide › Setup');
    const fence: RetrievedPassage = { id: 'cli#1', text: '```sh\nnpx tool --init\n```', source: 'cli.md › Setup', headings: 'Guide › Setup', score: 1 };
    const best = (text: string) => {
      const passages = [prose(text), fence];
      // The prose was retrieved; the fence is its neighbour, one place before it.
      const candidates = candidatesOf(passages, [
        { rank: 0, offset: 0 },
        { rank: 0, offset: -1 },
      ]);
      return composeAnswer(v(1, 0), passages, candidates, [v(1, 0), v(0, 1)], { sentences: 1, context: 0 }, terms({ config: 3, project: 2 })).text.split(
        '\n\n',
      )[0];
    };
    assert.equal(best('This will create a config file for your project.'), '`npx tool --init` This will create a config file for your project. [1]');
    // "It is…" speaks of nothing before it.
    assert.equal(best('It is possible to keep a config file per project.'), 'It is possible to keep a config file per project. [1]');
  });

  it('prefers the first passage, and quotes a second one for the query words the first lacks, under its own number', () => {
    const passages = [
      passage('server', 'Heartbeats detect a broken connection on the server. A broken connection is closed by the server.', 'Guide › Heartbeats', 0.9),
      passage('options', 'The heartbeat interval is thirty seconds by default.', 'Guide › Options', 0.8),
    ];
    const candidates = candidatesOf(passages);
    const words = terms({ broken: 3, connection: 2, server: 1, interval: 4 });
    const vectors = [v(1, 0), v(1, 0), v(1, 0)];
    const answer = composeAnswer(v(1, 0), passages, candidates, vectors, { sentences: 2, context: 0 }, words);
    assert.equal(
      answer.text,
      'Heartbeats detect a broken connection on the server. [1] The heartbeat interval is thirty seconds by default. [2]\n\nSources:\n[1] server.md › Heartbeats\n[2] options.md › Options',
    );
    assert.deepEqual(
      answer.sources.map((s) => s.id),
      ['server', 'options'],
    );
  });

  it('ranks a piece of a section next to the piece retrieval ranked first: a list cut in pieces is one section', () => {
    const piece = (id: string, text: string, source: string): RetrievedPassage => ({ id, text, source, headings: source.split(' › ')[1]!, score: 1 });
    const passages = [
      piece('agent#1', 'The timeout factor is two.', 'agent.md › Options'),
      piece('other#1', 'The maximum retry count is ten.', 'other.md › Errors'),
      piece('misc#1', 'Nothing here.', 'misc.md › Misc'),
      piece('agent#2', 'The maximum retry count is five.', 'agent.md › Options'),
    ];
    // ("Nothing here." is no sentence to quote.) The fourth is a little closer in meaning than the second.
    const vectors = [v(0, 1), v(0.8, 0.6), v(1, 0)];
    const best = (list: readonly RetrievedPassage[]) =>
      composeAnswer(v(1, 0), list, candidatesOf(list), vectors, { sentences: 1, context: 0 }, terms({ retry: 5, maximum: 1 })).text.split('\n\n')[0];
    // Fourth, under the first passage's heading: it counts as second, ahead of the other file's sentence it outscores a little.
    assert.equal(best(passages), 'The maximum retry count is five. [1]');
    // Under a heading of its own it keeps its fourth place, and the closer-ranked sentence wins.
    const apart = passages.map((p) => (p.id === 'agent#2' ? { ...p, source: 'agent.md › Limits', headings: 'Limits' } : p));
    assert.equal(best(apart), 'The maximum retry count is ten. [1]');
  });

  it('leaves out a sentence that nearly repeats one already quoted, for one that says something else', () => {
    const passages = [
      passage(
        'compat',
        'Version 3 of the tool needs node 8 to run well. Version 2 of the tool needs node 6 to run well. Node 12 is required by the newest release.',
      ),
    ];
    const candidates = candidatesOf(passages);
    const answer = composeAnswer(
      v(1, 0),
      passages,
      candidates,
      candidates.map(() => v(1, 0)),
      { sentences: 2, context: 0 },
      terms({ version: 2, tool: 2, node: 1, required: 1 }),
    );
    assert.equal(answer.text.split('\n\n')[0], 'Version 3 of the tool needs node 8 to run well. [1] Node 12 is required by the newest release. [1]');
  });

  it('leads with the API or event-name heading a quoted sentence leaves unnamed', () => {
    const passages = [passage('serializers', 'Serializes an error like object, including its cause.', 'API › exports.errWithCause(error)')];
    const answer = composeAnswer(v(1, 0), passages, candidatesOf(passages), [v(1, 0)], {}, terms({ serialize: 2, error: 1, cause: 3 }));
    assert.equal(answer.text.split('\n\n')[0], 'exports.errWithCause(error): Serializes an error like object, including its cause. [1]');
    const prose = [passage('guide', 'Serializes an error like object, including its cause.', 'API › Errors and causes')];
    assert.equal(
      composeAnswer(v(1, 0), prose, candidatesOf(prose), [v(1, 0)], {}, terms({ serialize: 2, cause: 3 })).text.split('\n\n')[0],
      'Serializes an error like object, including its cause. [1]',
    );
    const event = [passage('channels', 'This message is published when a new outgoing request is created.', 'Diagnostics › undici:request:create')];
    assert.equal(
      composeAnswer(v(1, 0), event, candidatesOf(event), [v(1, 0)], {}, terms({ publish: 2, request: 1 })).text.split('\n\n')[0],
      'undici:request:create: This message is published when a new outgoing request is created. [1]',
    );
    const note = [passage('notes', 'A message is published when a new outgoing request is created.', 'Diagnostics › Note: requests')];
    assert.equal(
      composeAnswer(v(1, 0), note, candidatesOf(note), [v(1, 0)], {}, terms({ publish: 2, request: 1 })).text.split('\n\n')[0],
      'A message is published when a new outgoing request is created. [1]',
    );
  });

  it('reads a constructor, a method, a return type or an assigned result as an API heading, named by its callee', () => {
    const lead = (heading: string, text: string, words: Record<string, number>) => {
      const passages = [passage('api', text, `API › ${heading}`)];
      return composeAnswer(v(1, 0), passages, candidatesOf(passages), [v(1, 0)], {}, terms(words)).text.split('\n\n')[0];
    };
    const regex = { regex: 3, catastroph: 2 };
    assert.equal(
      lead('const ok = safe(re, opts={})', 'Whether the regex is not possibly catastrophic.', regex),
      'const ok = safe(re, opts={}): Whether the regex is not possibly catastrophic. [1]',
    );
    // Its callee named by a sentence, the heading adds nothing.
    assert.equal(
      lead('const ok = safe(re, opts={})', 'Call safe on the regex: catastrophic ones fail.', regex),
      'Call safe on the regex: catastrophic ones fail. [1]',
    );
    assert.equal(
      lead('new Client(url[, options])', 'Keeps a pool of connections open to one origin.', { pool: 2, origin: 3 }),
      'new Client(url[, options]): Keeps a pool of connections open to one origin. [1]',
    );
    assert.equal(
      lead('.checkIgnore(target: string): TestResult', 'Equivalent to git check-ignore -v.', { git: 2, ignore: 3 }),
      '.checkIgnore(target: string): TestResult: Equivalent to git check-ignore -v. [1]',
    );
    // A label of what it is, as Node.js's docs write them, before the name.
    assert.equal(
      lead('Static method: AbortSignal.any(signals)', 'Returns a new `AbortSignal` aborted when any of the signals is.', { abort: 2, signal: 3 }),
      'Static method: AbortSignal.any(signals): Returns a new `AbortSignal` aborted when any of the signals is. [1]',
    );
    // An option's name alone: one identifier with a capital inside.
    assert.equal(
      lead('caseSensitive', 'Files should be matched regardless of upper and lower case.', { upper: 2, lower: 2, case: 3 }),
      'caseSensitive: Files should be matched regardless of upper and lower case. [1]',
    );
    // A command-line option, as CLI references head each one.
    assert.equal(
      lead('--fresh', 'Perform a fresh configuration of the build tree.', { fresh: 2, configur: 3 }),
      '--fresh: Perform a fresh configuration of the build tree. [1]',
    );
    assert.equal(
      lead('--max-old-space-size=SIZE (in MiB)', 'Sets the max memory size of the old memory section.', { memori: 2, size: 3 }),
      '--max-old-space-size=SIZE (in MiB): Sets the max memory size of the old memory section. [1]',
    );
    // A name in a notation of its own, one word of code.
    assert.equal(
      lead('$<TARGET_RUNTIME_DLLS:tgt>', 'Lists the DLLs that the target depends on at runtime.', { dll: 3, runtim: 2 }),
      '$<TARGET_RUNTIME_DLLS:tgt>: Lists the DLLs that the target depends on at runtime. [1]',
    );
    // Prose that opens like one is not an API, nor is one word.
    assert.equal(lead('Usage', 'Streams keep their order now.', { stream: 2, order: 3 }), 'Streams keep their order now. [1]');
    assert.equal(lead('new features in 2.0', 'Streams keep their order now.', { stream: 2, order: 3 }), 'Streams keep their order now. [1]');
    assert.equal(lead('Class notes: read first', 'Streams keep their order now.', { stream: 2, order: 3 }), 'Streams keep their order now. [1]');
  });

  it('leads a sentence that opens its passage and points back ("This is…") with the heading it is written under', () => {
    const doc = '## AlwaysOn Sampler\n\nSamples every trace.\n\n> This is used as a default Sampler\n\n## AlwaysOff Sampler\n\nSamples no trace.';
    const passages = chunkMarkdown(doc, 'sdk.md').map((p) => ({ ...p, score: 1 }));
    const quote = passages.find((p) => p.text.includes('default'))!;
    const answer = composeAnswer(v(1, 0), [quote], candidatesOf([quote]), [v(1, 0)], {}, terms({ default: 2, sampler: 1 }));
    // The blockquote's `>` is markup, and "This" is the sampler the heading names.
    assert.equal(answer.text.split('\n\n')[0], 'AlwaysOn Sampler: This is used as a default Sampler [1]');
    const plain = [passage('plain', 'The default sampler samples every trace.', 'Samplers › AlwaysOn Sampler')];
    assert.equal(
      composeAnswer(v(1, 0), plain, candidatesOf(plain), [v(1, 0)], {}, terms({ default: 2, sampler: 1 })).text.split('\n\n')[0],
      'The default sampler samples every trace. [1]',
    );
  });

  it('widens retrieved passages with their section neighbours, each carrying the rank of the passage it neighbours', () => {
    const doc = '# Net\n## Heartbeats\nFirst paragraph here.\n\nSecond paragraph here.\n\nThird paragraph here.\n## Other\nElsewhere entirely.';
    const all = chunkMarkdown(doc, 'net.md');
    const sections = Sections.of(all);
    const [first, second, third, other] = all.map((p) => ({ ...p, score: 1 }));
    const placed = sections.widen([second!, other!], 1, 1);
    assert.deepEqual(
      placed.map((p) => [p.passage.id, p.rank, p.offset]),
      [
        [second!.id, 0, 0],
        [other!.id, 1, 0],
        [first!.id, 0, -1],
        [third!.id, 0, 1],
      ],
    );
    assert.deepEqual(sections.around('missing', 2), []);
  });

  it('a served answer quotes the table row beside the retrieved paragraph when it holds the query word the paragraph lacks', async () => {
    const doc = [
      '# Connections',
      '## Heartbeats',
      'A server notices a broken connection when heartbeats stop arriving, and the server then closes that broken connection.',
      '',
      '| Option | Default |',
      '| --- | --- |',
      '| heartbeat | every 30 seconds |',
      '',
      '## Reconnecting',
      'A client reconnects with backoff after the server closes its connection.',
    ].join('\n');
    const embedder = hashingEmbedder(256);
    const index = await indexPassages(chunkMarkdown(doc, 'net.md'), embedder);
    const rag = ragWorker({ embedder, index, k: 1, abstain: false });
    try {
      const tokens = await lastValueFrom(
        rag.generate(generateRequest({ prompt: 'When does a server notice a broken connection, and what is the default heartbeat?' })).pipe(toArray()),
      );
      const answer = tokens.map((t) => t.text).join('');
      assert.match(answer, /Option: heartbeat; Default: every 30 seconds \[2\]/);
      assert.match(answer, /\n\nSources:\n\[1\] net\.md › Heartbeats\n\[2\] net\.md › Heartbeats$/);
    } finally {
      rag.close();
    }
  });
});
