/**
 * The flag table of the `sluice` command: one declaration per flag — its name, environment
 * variable, type, shown default, help, and the option it maps to. The `--help` text, the
 * parser, the environment reading and the option mapping are derived from it.
 */
import { delimiter } from 'node:path';
import { parseArgs } from 'node:util';
import { PII_KINDS } from '../ai/stages/pii-detectors.js';
import { errorMessage } from '../core/errors.js';

export type Command = 'serve' | 'worker';

/**
 * How a flag's value is read: `string`; `integer` (a whole number, at least `min`); `port` (an
 * integer ≤ 65535); `switch` (a boolean flag, its variable 1/true or 0/false); `list` (repeatable,
 * its variable split on `separator`).
 */
export type FlagType = 'string' | 'integer' | 'port' | 'switch' | 'list';

export interface Flag {
  readonly name: string;
  readonly type: FlagType;
  /** Variables read when the flag is not given, first set one wins. */
  readonly env?: readonly string[];
  /** How a `list` variable is split. Default `,`. */
  readonly separator?: string | RegExp;
  /** The value's placeholder in the help (`<n>`). */
  readonly arg?: string;
  /** The default the help shows (the server's option schema applies it). */
  readonly default?: string;
  /** What the help says of the flag, per command it belongs to. */
  readonly help: Partial<Record<Command, string>>;
  /** Preformatted lines after the help (an attribute list). */
  readonly details?: readonly string[];
  /** The least value of an `integer`. */
  readonly min?: number;
  /** The option it maps to, a dotted path (`limits.maxConcurrent`); none for flags read by hand. */
  readonly to?: string;
}

const MODELS_HELP = 'model files; missing ones are generated';
const POOL_HELP = 'inference worker threads';

export const FLAGS: readonly Flag[] = [
  { name: 'host', type: 'string', arg: '<host>', env: ['SLUICE_HOST'], default: '127.0.0.1', help: { serve: 'interface to listen on' }, to: 'host' },
  { name: 'port', type: 'port', arg: '<n>', env: ['SLUICE_PORT', 'PORT'], default: '8787', help: { serve: 'port, 0 for any free one' }, to: 'port' },
  {
    name: 'token',
    type: 'list',
    arg: '<[tenant:]token>',
    env: ['SLUICE_TOKENS'],
    help: {
      serve:
        'accept this bearer token; repeatable {env} (tenant defaults to "default"; without tokens the server is open, which is allowed on a loopback host only)',
    },
  },
  { name: 'insecure', type: 'switch', env: ['SLUICE_INSECURE'], help: { serve: 'allow an open server on a non-loopback host' }, to: 'insecure' },
  {
    name: 'origin',
    type: 'list',
    arg: '<url>',
    env: ['SLUICE_ORIGINS'],
    default: 'any',
    help: { serve: 'allow browsers from this origin; repeatable' },
    to: 'origins',
  },
  { name: 'models', type: 'string', arg: '<dir>', env: ['SLUICE_MODELS'], default: 'models', help: { serve: MODELS_HELP, worker: MODELS_HELP }, to: 'models' },
  {
    name: 'corpus',
    type: 'string',
    arg: '<dir>',
    env: ['SLUICE_CORPUS'],
    default: 'bundled docs',
    help: {
      serve:
        'Markdown, text, HTML, reStructuredText, AsciiDoc and PDF files to answer from, subfolders too; with --upstream, sluice-rag retrieves here for an upstream model',
    },
    to: 'corpus',
  },
  {
    name: 'corpus-ignore',
    type: 'list',
    arg: '<pattern>',
    env: ['SLUICE_CORPUS_IGNORE'],
    help: { serve: "leave the corpus's documents matching this .gitignore-style pattern out, beside those its .sluiceignore names; repeatable {env}" },
    to: 'corpusIgnore',
  },
  {
    name: 'corpus-max-file-bytes',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_CORPUS_MAX_FILE_BYTES'],
    default: '8388608 (8 MiB)',
    min: 1,
    help: { serve: 'skip (and count) corpus files larger than this, so that memory while indexing stays bounded' },
    to: 'corpusMaxFileBytes',
  },
  {
    name: 'retrieval',
    type: 'string',
    arg: '<mode>',
    env: ['SLUICE_RETRIEVAL'],
    default: 'hybrid',
    help: { serve: 'how sluice-rag ranks passages: hybrid (BM25 and the embedding, fused), dense or lexical' },
    to: 'retrieval',
  },
  {
    name: 'model',
    type: 'list',
    arg: '<dir>',
    env: ['SLUICE_MODEL'],
    separator: delimiter,
    help: {
      serve:
        "serve a decoder you exported: model.onnx (or onnx/model.onnx) with its KV cache, tokenizer.json, tokenizer_config.json (chat template), optional config.json and generation_config.json; served under the directory's name as the default model, and sluice-rag answers with it; repeatable {env}; needs @huggingface/tokenizers and @huggingface/jinja",
    },
  },
  {
    name: 'embed-model',
    type: 'string',
    arg: '<dir>',
    env: ['SLUICE_EMBED_MODEL'],
    help: {
      serve:
        'embed with a sentence-embedding model you exported (sentence-transformers / Optimum layout: model.onnx or onnx/model.onnx, tokenizer.json, 1_Pooling/config.json, modules.json) instead of the generated one: the corpus, the questions and /v1/embeddings; needs @huggingface/tokenizers',
    },
    to: 'embedModel',
  },
  {
    name: 'pool-size',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_POOL_SIZE'],
    default: 'min(cores, 2)',
    help: { serve: POOL_HELP, worker: POOL_HELP },
    to: 'poolSize',
  },
  {
    name: 'pool-nice',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_POOL_NICE'],
    default: '10',
    min: 0,
    help: {
      serve:
        "how far below the server's priority its inference threads run, in nice steps 0-19 (Linux): the event loop answering sockets wins a core a busy model shares",
    },
    to: 'poolNiceness',
  },
  {
    name: 'shutdown-timeout',
    type: 'integer',
    arg: '<ms>',
    env: ['SLUICE_SHUTDOWN_TIMEOUT'],
    default: '10000',
    help: { serve: 'time running requests get after SIGTERM' },
    to: 'shutdownTimeout',
  },
  {
    name: 'max-concurrent',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_MAX_CONCURRENT'],
    default: '8',
    help: { serve: 'requests per WebSocket connection' },
    to: 'limits.maxConcurrent',
  },
  {
    name: 'tenant-concurrent',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_TENANT_CONCURRENT'],
    default: '32',
    help: { serve: 'requests per tenant, all connections' },
    to: 'limits.tenantConcurrent',
  },
  {
    name: 'max-queue',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_MAX_QUEUE'],
    default: '64 per core',
    min: 0,
    help: { serve: 'requests waiting at the door, all models and transports; past it the lowest priority is refused with 429 and Retry-After' },
    to: 'maxQueue',
  },
  {
    name: 'max-queue-wait',
    type: 'integer',
    arg: '<ms>',
    env: ['SLUICE_MAX_QUEUE_WAIT'],
    help: {
      serve:
        'the longest a request should wait at the door: the queue holds no more than drains in that time, none more once one waited that long, and the rest is refused at once',
    },
    to: 'maxQueueWait',
  },
  {
    name: 'max-loop-lag',
    type: 'integer',
    arg: '<ms>',
    env: ['SLUICE_MAX_LOOP_LAG'],
    min: 1,
    help: { serve: 'while the event loop runs later than this, HTTP completions are refused at the door with 429 (priority ones still enter)' },
    to: 'maxLoopLag',
  },
  {
    name: 'max-streams',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_MAX_STREAMS'],
    default: '64',
    help: { serve: 'generations streaming at once, per model' },
    to: 'streams',
  },
  {
    name: 'max-batch',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_MAX_BATCH'],
    default: '16',
    help: {
      serve: 'decode steps of concurrent generations run as one model call (continuous batching; charlm); 1 runs each alone',
      worker: 'decode steps of the generations it runs at once, as one model call; 1 runs each alone',
    },
    to: 'maxBatch',
  },
  {
    name: 'step-tokens',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_STEP_TOKENS'],
    default: '2048',
    help: {
      serve: "tokens one batched call of a --model decoder feeds at most, prompts joining included: a long prompt does not stall the others' next tokens",
    },
    to: 'stepTokens',
  },
  {
    name: 'length-bucket',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_LENGTH_BUCKET'],
    default: '4096',
    min: 1,
    help: {
      serve:
        "decode steps of a --model decoder whose contexts fall in one window of n positions share a call, shorter caches left-padded and masked; 1 batches only equal lengths (each row's logits then equal a lone run's bit for bit)",
    },
    to: 'lengthBucket',
  },
  {
    name: 'kv-cache-mb',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_KV_CACHE_MB'],
    default: '1024',
    help: {
      serve:
        "MiB a --model decoder's KV caches may hold between steps; past it the caches of generations whose readers paused longest are dropped and rebuilt on resume",
    },
    to: 'kvCacheMb',
  },
  {
    name: 'stage-capacity',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_STAGE_CAPACITY'],
    default: '16',
    help: { serve: "requests each of sluice-rag's shared stages buffers (another model's requests wait at the door until a stream slot is free)" },
    to: 'stageCapacity',
  },
  {
    name: 'tenant-priority',
    type: 'list',
    arg: '<tenant:class>',
    env: ['SLUICE_TENANT_PRIORITIES'],
    help: { serve: "the class (low, default, high) of a tenant's requests that name no service_tier; repeatable {env}" },
  },
  {
    name: 'max-tokens',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_MAX_TOKENS'],
    default: '4096',
    help: { serve: 'largest max_tokens a request may ask' },
    to: 'limits.maxTokens',
  },
  { name: 'rate', type: 'integer', arg: '<n>', env: ['SLUICE_RATE'], default: '20', help: { serve: 'frames per second per connection' } },
  {
    name: 'tenant-rate',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_TENANT_RATE'],
    default: '50',
    help: { serve: 'requests per second per tenant, all connections (burst 2x)' },
  },
  {
    name: 'nats',
    type: 'string',
    arg: '<url>',
    env: ['SLUICE_NATS'],
    help: {
      serve: 'generate on worker processes over NATS JetStream (run "sluice worker" beside it); needs @nats-io/jetstream and @nats-io/transport-node',
      worker: 'NATS server URL(s), comma-separated {env} (required)',
    },
    to: 'nats',
  },
  {
    name: 'upstream',
    type: 'list',
    arg: '<url[#attrs]>',
    env: ['SLUICE_UPSTREAMS'],
    separator: /\s+/,
    help: {
      serve:
        'gateway mode: serve the models of this OpenAI-compatible server (vLLM, llama.cpp, Ollama, a hosted API, another sluice) instead of the embedded ones; repeatable, tried in the order given {env}. Attributes after #, joined with &:',
    },
    details: [
      '  key=ENV_VAR    send the key held by this environment variable',
      "  name=NAME      name in logs and metrics (default: the URL's host)",
      '  weight=N       share of the requests it gets first (default: order)',
      '  models=a,b     its models (default: asked of it at start)',
      "e.g. --upstream 'https://api.openai.com/v1#key=OPENAI_API_KEY&models=gpt-4o-mini'",
    ],
  },
  {
    name: 'upstream-timeout',
    type: 'integer',
    arg: '<ms>',
    env: ['SLUICE_UPSTREAM_TIMEOUT'],
    default: '30000',
    min: 1,
    help: { serve: 'gateway mode: silence from an upstream while a token is wanted (before its first token or between two) that fails the attempt' },
    to: 'gateway.idleTimeout',
  },
  {
    name: 'upstream-attempts',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_UPSTREAM_ATTEMPTS'],
    default: '3',
    min: 1,
    help: {
      serve:
        'gateway mode: attempts per upstream before the next one is tried, the first included; only rate limits, 5xx, silence and broken connections are retried',
    },
    to: 'gateway.attempts',
  },
  {
    name: 'cache-mb',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_CACHE_MB'],
    min: 1,
    help: {
      serve:
        "gateway mode: cache the answers of deterministic requests (temperature 0 or a seed) in up to n MiB, each tenant's apart, and share identical ones in flight",
    },
  },
  {
    name: 'rag-model',
    type: 'string',
    arg: '<name>',
    env: ['SLUICE_RAG_MODEL'],
    default: 'the first model listed',
    help: { serve: "gateway mode with --corpus: the upstream model that writes sluice-rag's answers from the passages retrieved here" },
    to: 'ragModel',
  },
  {
    name: 'guard',
    type: 'switch',
    env: ['SLUICE_GUARD'],
    help: { serve: 'classify every prompt for injection with the embedded guard model, for every model, upstream ones too (sluice-rag always does)' },
    to: 'guard',
  },
  {
    name: 'redact',
    type: 'string',
    arg: '<kinds>',
    env: ['SLUICE_REDACT'],
    help: { serve: `redact personal data from every answer as it streams: all, or some of ${PII_KINDS.join(',')}` },
  },
  { name: 'no-inspect', type: 'switch', env: ['SLUICE_NO_INSPECT'], help: { serve: 'do not serve the pipeline inspector on /inspect' } },
  {
    name: 'inspect-token',
    type: 'list',
    arg: '<token>',
    env: ['SLUICE_INSPECT_TOKENS'],
    help: {
      serve:
        "an operator's token: opens /inspect on every tenant's requests (a --token sees only its own tenant's); not accepted by the API; needs --token; repeatable",
    },
    to: 'inspectTokens',
  },
  {
    name: 'inspect-content',
    type: 'switch',
    env: ['SLUICE_INSPECT_CONTENT'],
    help: { serve: "show running requests' prompts and the end of their answers on /inspect (off: figures only)" },
    to: 'inspectContent',
  },
  {
    name: 'concurrency',
    type: 'integer',
    arg: '<n>',
    env: ['SLUICE_CONCURRENCY'],
    default: '4',
    min: 1,
    help: { worker: 'requests generated at once' },
    to: 'concurrency',
  },
];

/** `-h` and `-v`, which every command takes and the help lists last. */
const META: readonly { readonly name: string; readonly short: string; readonly help: string }[] = [
  { name: 'help', short: 'h', help: 'this text' },
  { name: 'version', short: 'v', help: 'the version' },
];

/** A bad flag or environment value: printed without a stack, exit code 2. */
export class UsageError extends Error {}

export type FlagValues = Readonly<Record<string, string | boolean | string[] | undefined>>;

/** The flags given (any command's), or a `UsageError` naming the bad one. */
export function readFlags(argv: readonly string[]): FlagValues {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }> = {};
  for (const flag of FLAGS) options[flag.name] = { type: flag.type === 'switch' ? 'boolean' : 'string', ...(flag.type === 'list' && { multiple: true }) };
  for (const meta of META) options[meta.name] = { type: 'boolean', short: meta.short };
  try {
    return parseArgs({ args: [...argv], allowPositionals: true, strict: true, options }).values as FlagValues;
  } catch (err) {
    throw new UsageError(errorMessage(err));
  }
}

export function flagNamed(name: string): Flag {
  const flag = FLAGS.find((f) => f.name === name);
  if (flag === undefined) throw new Error(`no flag --${name}`);
  return flag;
}

/** A flag's value as given, else its first set variable's, with where it came from (`--name` or the variable). */
export interface Given<T> {
  readonly value: T;
  readonly source: string;
}

/** Reads a flag of the table from the flags given and the environment; undefined when neither sets it. */
export function given(flag: Flag, values: FlagValues, env: NodeJS.ProcessEnv): Given<string | number | boolean | string[]> | undefined {
  const fromFlag = values[flag.name];
  if (fromFlag !== undefined && !(Array.isArray(fromFlag) && fromFlag.length === 0)) {
    if (flag.type === 'list') return { value: [...(fromFlag as string[])], source: `--${flag.name}` };
    // An empty number flag is no flag: the server's default applies.
    if (fromFlag === '' && (flag.type === 'integer' || flag.type === 'port')) return undefined;
    return { value: flag.type === 'switch' ? (fromFlag as boolean) : checked(flag, fromFlag as string, `--${flag.name}`), source: `--${flag.name}` };
  }
  for (const variable of flag.env ?? []) {
    const raw = env[variable];
    if (flag.type === 'switch') {
      if (raw !== undefined && !['', '0', '1', 'true', 'false'].includes(raw)) throw new UsageError(`${variable}: expected 1 or 0, got "${raw}"`);
      if (raw === '1' || raw === 'true') return { value: true, source: variable };
      continue;
    }
    if (raw === undefined || raw === '') continue;
    if (flag.type !== 'list') return { value: checked(flag, raw, variable), source: variable };
    const items = raw
      .split(flag.separator ?? ',')
      .map((s) => (flag.separator === undefined ? s.trim() : s))
      .filter((s) => s.trim().length > 0);
    if (items.length > 0) return { value: items, source: variable };
  }
  return undefined;
}

function checked(flag: Flag, raw: string, source: string): string | number {
  if (flag.type === 'string') return raw;
  if (!/^\d+$/.test(raw.trim())) throw new UsageError(`${source}: expected a whole number, got "${raw}"`);
  const value = Number(raw.trim());
  if (flag.type === 'port' && value > 65535) throw new UsageError(`${source}: expected a port from 0 to 65535, got "${raw}"`);
  if (flag.min !== undefined && value < flag.min) throw new UsageError(`${source}: expected at least ${flag.min}`);
  return value;
}

/** The flag whose option is `path` (`ragModel` → `--rag-model`), for errors only the running server finds. */
export function flagOf(path: string): string | undefined {
  const flag = FLAGS.find((f) => f.to === path);
  return flag === undefined ? undefined : `--${flag.name}`;
}

const COLUMN = 30;
const WIDTH = 106;

/** A command's options section: one entry per flag of the table it takes, then `-h` and `-v` for serve. */
export function helpFor(command: Command): string {
  const lines: string[] = [];
  for (const flag of FLAGS) {
    const text = flag.help[command];
    if (text === undefined) continue;
    lines.push(...entry(`--${flag.name}${flag.arg === undefined ? '' : ` ${flag.arg}`}`, describe(flag, text), flag.details ?? []));
  }
  if (command === 'serve') for (const meta of META) lines.push(...entry(`-${meta.short}, --${meta.name}`, meta.help, []));
  return `${lines.join('\n')}\n`;
}

/** The help text with its variable in brackets (where `{env}` marks, else at the end) and its default. */
function describe(flag: Flag, text: string): string {
  const env = flag.env === undefined ? '' : `[${envText(flag)}]`;
  const placed = text.includes('{env}') ? text.replace('{env}', env) : env === '' ? text : `${text} ${env}`;
  if (flag.default === undefined) return placed;
  // A default in words reads as a note ("default: bundled docs"), a value as a value ("default 8787").
  return `${placed} (default${/^[a-z]+ [a-z ]+$/.test(flag.default) ? ':' : ''} ${flag.default})`;
}

function envText(flag: Flag): string {
  const [first, ...rest] = flag.env!;
  if (flag.type === 'switch') return `${first}=1`;
  const alternatives = rest.map((v) => `, else ${v}`).join('');
  if (flag.type !== 'list') return `${first}${alternatives}`;
  const split =
    flag.separator === undefined ? 'comma-separated' : flag.separator instanceof RegExp ? 'space-separated' : `several separated by "${flag.separator}"`;
  return `${first}${alternatives}, ${split}`;
}

/** `name` in the first column, `text` wrapped beside it, `details` under it. */
function entry(name: string, text: string, details: readonly string[]): string[] {
  const lines: string[] = [];
  let line = `  ${name}`.padEnd(COLUMN - 1);
  for (const word of text.split(' ')) {
    if (line.length + 1 + word.length > WIDTH && line.trim().length > name.length) {
      lines.push(line);
      line = ' '.repeat(COLUMN - 1);
    }
    line += ` ${word}`;
  }
  lines.push(line);
  for (const detail of details) lines.push(`${' '.repeat(COLUMN)}${detail}`);
  return lines;
}
