/**
 * The `sluice` command. `sluice serve` starts the server on embedded defaults (models
 * generated from code, the bundled corpus); flags and `SLUICE_*` environment variables
 * (and `PORT`) change the port, tokens, models and limits. Flags win over the environment.
 *
 * Bad flags or environment values print what is wrong and exit with 2; missing peers
 * (every one the run needs, checked before any is loaded) and a start-up failure (port
 * in use...) exit with 1. SIGTERM or SIGINT shuts down gracefully and
 * exits with 0; a second signal exits at once with 130.
 */
import { readFileSync } from 'node:fs';
import { findUp } from './core/package-files.js';
import { delimiter } from 'node:path';
import { parseArgs } from 'node:util';
import { InvalidOptionsError, MissingPeerError } from './core/errors.js';
import { SUBPROTOCOL } from './serve/protocol.js';
// Types only: the server's modules load their peers, so they are imported once the peers are checked.
import type { RunningServer, ServeOptions } from './serve/app.js';
import type { UpstreamOptions } from './ai/inference/gateway.js';
import { PII_KINDS, type PiiKind } from './ai/stages/redact.js';
import { pinoPeer, requirePeers } from './core/peers.js';
import type { PeerUser } from './core/peer-list.js';
import type { RequestLogEntry } from './serve/request-log.js';

const HELP = `Usage: sluice serve [options]

Starts the sluice server: a chat page, WebSocket token streams (${SUBPROTOCOL}), an
OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models),
the /inspect page, /metrics, /healthz and /readyz.

Options (environment variable in brackets):
  --host <host>               interface to listen on [SLUICE_HOST] (default 127.0.0.1)
  --port <n>                  port, 0 for any free one [SLUICE_PORT, else PORT] (default 8787)
  --token <[tenant:]token>    accept this bearer token; repeatable [SLUICE_TOKENS, comma-separated]
                              (tenant defaults to "default"; without tokens the server is open,
                              which is allowed on a loopback host only)
  --insecure                  allow an open server on a non-loopback host [SLUICE_INSECURE=1]
  --origin <url>              allow browsers from this origin; repeatable [SLUICE_ORIGINS] (default any)
  --models <dir>              model files; missing ones are generated [SLUICE_MODELS] (default models)
  --corpus <dir>              Markdown and text files to answer from, subfolders too; with --upstream,
                              sluice-rag retrieves here for an upstream model [SLUICE_CORPUS] (default: bundled docs)
  --model <dir>               serve a decoder you exported: model.onnx (or onnx/model.onnx) with its KV
                              cache, tokenizer.json, tokenizer_config.json (chat template), optional
                              config.json and generation_config.json; served under the directory's
                              name as the default model, and sluice-rag answers with it; repeatable
                              [SLUICE_MODEL, several separated by "${delimiter}"]; needs @huggingface/tokenizers
                              and @huggingface/jinja
  --pool-size <n>             inference worker threads [SLUICE_POOL_SIZE] (default min(cores, 2))
  --shutdown-timeout <ms>     time running requests get after SIGTERM [SLUICE_SHUTDOWN_TIMEOUT] (default 10000)
  --max-concurrent <n>        requests per WebSocket connection [SLUICE_MAX_CONCURRENT] (default 8)
  --tenant-concurrent <n>     requests per tenant, all connections [SLUICE_TENANT_CONCURRENT] (default 32)
  --max-tokens <n>            largest max_tokens a request may ask [SLUICE_MAX_TOKENS] (default 4096)
  --rate <n>                  frames per second per connection [SLUICE_RATE] (default 20)
  --nats <url>                generate on worker processes over NATS JetStream (run "sluice worker"
                              beside it); needs @nats-io/jetstream and @nats-io/transport-node [SLUICE_NATS]
  --upstream <url[#attrs]>    gateway mode: serve the models of this OpenAI-compatible server (vLLM,
                              llama.cpp, Ollama, a hosted API, another sluice) instead of the embedded
                              ones; repeatable, tried in the order given [SLUICE_UPSTREAMS, space-separated].
                              Attributes after #, joined with &:
                                key=ENV_VAR    send the key held by this environment variable
                                name=NAME      name in logs and metrics (default: the URL's host)
                                weight=N       share of the requests it gets first (default: order)
                                models=a,b     its models (default: asked of it at start)
                              e.g. --upstream 'https://api.openai.com/v1#key=OPENAI_API_KEY&models=gpt-4o-mini'
  --upstream-timeout <ms>     gateway mode: silence from an upstream while a token is wanted (before
                              its first token or between two) that fails the attempt [SLUICE_UPSTREAM_TIMEOUT]
                              (default 30000)
  --upstream-attempts <n>     gateway mode: attempts per upstream before the next one is tried, the first
                              included; only rate limits, 5xx, silence and broken connections are retried
                              [SLUICE_UPSTREAM_ATTEMPTS] (default 3)
  --cache-mb <n>              gateway mode: cache the answers of deterministic requests (temperature 0
                              or a seed) in up to n MiB, each tenant's apart, and share identical ones in
                              flight [SLUICE_CACHE_MB]
  --rag-model <name>          gateway mode with --corpus: the upstream model that writes sluice-rag's
                              answers from the passages retrieved here [SLUICE_RAG_MODEL] (default: the
                              first model listed)
  --guard                     classify every prompt for injection with the embedded guard model, for
                              every model, upstream ones too (sluice-rag always does) [SLUICE_GUARD=1]
  --redact <kinds>            redact personal data from every answer as it streams: all, or some of
                              ${PII_KINDS.join(',')} [SLUICE_REDACT]
  --no-inspect                do not serve the pipeline inspector on /inspect [SLUICE_NO_INSPECT=1]
  --inspect-token <token>     an operator's token: opens /inspect on every tenant's requests (a --token
                              sees only its own tenant's); not accepted by the API; needs --token;
                              repeatable [SLUICE_INSPECT_TOKENS, comma-separated]
  --inspect-content           show running requests' prompts and the end of their answers on
                              /inspect (off: figures only) [SLUICE_INSPECT_CONTENT=1]
  -h, --help                  this text
  -v, --version               the version

Usage: sluice worker --nats <url> [options]

Runs the language model for "sluice serve --nats": takes generation requests from the link
"charlm", streams the tokens back. Start as many as you like; they share the work.

  --nats <url>                NATS server URL(s), comma-separated [SLUICE_NATS] (required)
  --models <dir>              model files; missing ones are generated [SLUICE_MODELS] (default models)
  --concurrency <n>           requests generated at once [SLUICE_CONCURRENCY] (default 4)
  --pool-size <n>             inference worker threads [SLUICE_POOL_SIZE] (default min(cores, 2))
`;

/** The flag of a `serve options` field, for errors found when the server starts. */
const FLAG_OF: Readonly<Record<string, string>> = { ragModel: '--rag-model', inspectTokens: '--inspect-token', inspectContent: '--inspect-content' };

/** A bad flag or environment value: printed without a stack, exit code 2. */
class UsageError extends Error {}

type Flags = ReturnType<typeof readFlags>;

function readFlags(argv: readonly string[]) {
  return parseArgs({
    args: [...argv],
    allowPositionals: true,
    strict: true,
    options: {
      host: { type: 'string' },
      port: { type: 'string' },
      token: { type: 'string', multiple: true },
      insecure: { type: 'boolean' },
      origin: { type: 'string', multiple: true },
      models: { type: 'string' },
      corpus: { type: 'string' },
      model: { type: 'string', multiple: true },
      'pool-size': { type: 'string' },
      'shutdown-timeout': { type: 'string' },
      'max-concurrent': { type: 'string' },
      'tenant-concurrent': { type: 'string' },
      'max-tokens': { type: 'string' },
      rate: { type: 'string' },
      nats: { type: 'string' },
      upstream: { type: 'string', multiple: true },
      'cache-mb': { type: 'string' },
      'upstream-timeout': { type: 'string' },
      'upstream-attempts': { type: 'string' },
      'rag-model': { type: 'string' },
      guard: { type: 'boolean' },
      'no-inspect': { type: 'boolean' },
      'inspect-token': { type: 'string', multiple: true },
      'inspect-content': { type: 'boolean' },
      redact: { type: 'string' },
      concurrency: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
      version: { type: 'boolean', short: 'v' },
    },
  });
}

/** The flags given, or a `UsageError` naming the bad one. */
function flagValues(argv: readonly string[]): Flags['values'] {
  try {
    return readFlags(argv).values;
  } catch (err) {
    throw new UsageError(err instanceof Error ? err.message : String(err));
  }
}

/** An integer flag or variable; `undefined` when neither is set. */
function integer(flags: Flags['values'], env: NodeJS.ProcessEnv, flag: keyof Flags['values'], variable: string): number | undefined {
  const fromFlag = flags[flag];
  const raw = typeof fromFlag === 'string' ? fromFlag : env[variable];
  if (raw === undefined || raw === '') return undefined;
  if (!/^\d+$/.test(raw.trim())) throw new UsageError(`${typeof fromFlag === 'string' ? `--${flag}` : variable}: expected a whole number, got "${raw}"`);
  return Number(raw.trim());
}

/** `--port`, else `SLUICE_PORT`, else `PORT` (the variable hosting platforms and most Node servers read). */
function port(flags: Flags['values'], env: NodeJS.ProcessEnv): number | undefined {
  const [name, raw] = flags.port !== undefined ? ['--port', flags.port] : env.SLUICE_PORT ? ['SLUICE_PORT', env.SLUICE_PORT] : ['PORT', env.PORT];
  if (raw === undefined || raw === '') return undefined;
  if (!/^\d+$/.test(raw.trim())) throw new UsageError(`${name}: expected a whole number, got "${raw}"`);
  if (Number(raw) > 65535) throw new UsageError(`${name}: expected a port from 0 to 65535, got "${raw}"`);
  return Number(raw.trim());
}

function list(fromFlags: readonly string[] | undefined, raw: string | undefined): string[] | undefined {
  if (fromFlags !== undefined && fromFlags.length > 0) return [...fromFlags];
  if (raw === undefined || raw.trim() === '') return undefined;
  return raw
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

/** `tenant:token` or `token` (tenant `default`), as a map token → tenant. */
function tokens(entries: readonly string[] | undefined): Record<string, string> | undefined {
  if (entries === undefined) return undefined;
  const map: Record<string, string> = {};
  for (const entry of entries) {
    const colon = entry.indexOf(':');
    const [tenant, token] = colon === -1 ? ['default', entry] : [entry.slice(0, colon), entry.slice(colon + 1)];
    if (tenant.length === 0 || token.length === 0) throw new UsageError('--token: expected "token" or "tenant:token"');
    map[token] = tenant;
  }
  return map;
}

/**
 * One `--upstream`: a base URL, and after `#` attributes joined with `&` — `key=ENV_VAR`
 * (the key is read from that variable, so it never appears in a command line or a log),
 * `name`, `weight`, `models=a,b`.
 */
export function parseUpstream(spec: string, env: NodeJS.ProcessEnv): UpstreamOptions {
  const hash = spec.indexOf('#');
  const base = hash === -1 ? spec : spec.slice(0, hash);
  let url: URL;
  try {
    url = new URL(base);
  } catch {
    throw new UsageError(`--upstream: "${base}" is not a URL (e.g. http://127.0.0.1:8000/v1)`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new UsageError(`--upstream: "${base}" must be an http or https URL`);
  if (url.username !== '' || url.password !== '') throw new UsageError('--upstream: put the key in an environment variable (#key=ENV_VAR), not in the URL');
  const options: { baseUrl: string; name?: string; apiKey?: string; weight?: number; models?: string[] } = { baseUrl: base };
  for (const pair of hash === -1 ? [] : spec.slice(hash + 1).split('&')) {
    if (pair === '') continue;
    const eq = pair.indexOf('=');
    const [key, value] = eq === -1 ? [pair, ''] : [pair.slice(0, eq), pair.slice(eq + 1)];
    if (value === '') throw new UsageError(`--upstream ${base}: "${key}" needs a value (${key}=...)`);
    switch (key) {
      case 'key': {
        const secret = env[value];
        if (secret === undefined || secret === '') throw new UsageError(`--upstream ${base}: the environment variable ${value} (its key) is not set`);
        options.apiKey = secret;
        break;
      }
      case 'name':
        options.name = value;
        break;
      case 'weight': {
        const weight = Number(value);
        if (!Number.isFinite(weight) || weight < 0) throw new UsageError(`--upstream ${base}: weight must be a number ≥ 0, got "${value}"`);
        options.weight = weight;
        break;
      }
      case 'models':
        options.models = value.split(',').filter((m) => m.length > 0);
        break;
      default:
        throw new UsageError(`--upstream ${base}: unknown attribute "${key}" (known: key, name, weight, models)`);
    }
  }
  return options;
}

/** Gateway options from `--cache-mb`, `--upstream-timeout` and `--upstream-attempts`, which mean something only with upstreams. */
function gatewayTuning(v: Flags['values'], env: NodeJS.ProcessEnv, upstreams: readonly UpstreamOptions[] | undefined): ServeOptions['gateway'] | undefined {
  const tuning = [
    ['cache-mb', 'SLUICE_CACHE_MB', integer(v, env, 'cache-mb', 'SLUICE_CACHE_MB')],
    ['upstream-timeout', 'SLUICE_UPSTREAM_TIMEOUT', integer(v, env, 'upstream-timeout', 'SLUICE_UPSTREAM_TIMEOUT')],
    ['upstream-attempts', 'SLUICE_UPSTREAM_ATTEMPTS', integer(v, env, 'upstream-attempts', 'SLUICE_UPSTREAM_ATTEMPTS')],
  ] as const;
  const given = tuning.filter(([, , value]) => value !== undefined);
  if (given.length === 0) return undefined;
  for (const [flag, variable, value] of given) {
    const name = typeof v[flag] === 'string' ? `--${flag}` : variable;
    if (upstreams === undefined) throw new UsageError(`${name} tunes gateway mode: give --upstream too`);
    if (value === 0) throw new UsageError(`${name}: expected at least 1`);
  }
  const [cacheMb, timeout, attempts] = tuning.map(([, , value]) => value);
  return {
    ...(cacheMb !== undefined && { cache: { maxBytes: cacheMb * 2 ** 20 }, singleFlight: true }),
    ...(timeout !== undefined && { idleTimeout: timeout }),
    ...(attempts !== undefined && { attempts }),
  };
}

/** `--model` directories (or `SLUICE_MODEL`, split like PATH); gateway mode runs no model here. */
function localModels(
  fromFlags: readonly string[] | undefined,
  raw: string | undefined,
  upstreams: readonly UpstreamOptions[] | undefined,
): string[] | undefined {
  const dirs = fromFlags !== undefined && fromFlags.length > 0 ? [...fromFlags] : raw?.split(delimiter).filter((d) => d.trim().length > 0);
  if (dirs === undefined || dirs.length === 0) return undefined;
  if (dirs.some((d) => d.trim().length === 0)) throw new UsageError('--model: expected a directory');
  if (upstreams !== undefined) throw new UsageError('--model serves a model in this process: give --model or --upstream, not both');
  return dirs;
}

/** Flags and environment → `ServeOptions`, and the NATS URL generation goes to, if any. */
export function serveOptions(argv: readonly string[], env: NodeJS.ProcessEnv): ServeOptions & { nats?: string } {
  const v = flagValues(argv);
  const rate = integer(v, env, 'rate', 'SLUICE_RATE');
  const limits = {
    ...defined('maxConcurrent', integer(v, env, 'max-concurrent', 'SLUICE_MAX_CONCURRENT')),
    ...defined('tenantConcurrent', integer(v, env, 'tenant-concurrent', 'SLUICE_TENANT_CONCURRENT')),
    ...defined('maxTokens', integer(v, env, 'max-tokens', 'SLUICE_MAX_TOKENS')),
    ...(rate !== undefined && { rate: { perSecond: rate, burst: rate * 2 } }),
  };
  const upstreamSpecs = v.upstream ?? env.SLUICE_UPSTREAMS?.split(/\s+/).filter((s) => s.length > 0);
  const upstreams = upstreamSpecs === undefined || upstreamSpecs.length === 0 ? undefined : upstreamSpecs.map((spec) => parseUpstream(spec, env));
  return {
    ...defined('host', v.host ?? (env.SLUICE_HOST || undefined)),
    ...defined('port', port(v, env)),
    ...defined('tokens', tokens(list(v.token, env.SLUICE_TOKENS))),
    ...defined('insecure', v.insecure ?? switchedOn(env, 'SLUICE_INSECURE')),
    ...defined('origins', list(v.origin, env.SLUICE_ORIGINS)),
    ...defined('models', v.models ?? (env.SLUICE_MODELS || undefined)),
    ...defined('corpus', v.corpus ?? (env.SLUICE_CORPUS || undefined)),
    ...defined('localModels', localModels(v.model, env.SLUICE_MODEL, upstreams)),
    ...defined('poolSize', integer(v, env, 'pool-size', 'SLUICE_POOL_SIZE')),
    ...defined('shutdownTimeout', integer(v, env, 'shutdown-timeout', 'SLUICE_SHUTDOWN_TIMEOUT')),
    ...(Object.keys(limits).length > 0 && { limits }),
    ...defined('nats', v.nats ?? (env.SLUICE_NATS || undefined)),
    ...defined('upstreams', upstreams),
    ...defined('gateway', gatewayTuning(v, env, upstreams)),
    ...defined('ragModel', ragModel(v['rag-model'] ?? (env.SLUICE_RAG_MODEL || undefined), upstreams, v.corpus ?? (env.SLUICE_CORPUS || undefined))),
    ...defined('guard', v.guard ?? switchedOn(env, 'SLUICE_GUARD')),
    ...((v['no-inspect'] ?? switchedOn(env, 'SLUICE_NO_INSPECT')) === true && { inspect: false }),
    ...defined('inspectTokens', list(v['inspect-token'], env.SLUICE_INSPECT_TOKENS)),
    ...((v['inspect-content'] ?? switchedOn(env, 'SLUICE_INSPECT_CONTENT')) === true && { inspectContent: true }),
    ...defined('redact', redactKinds(v.redact, env.SLUICE_REDACT)),
  };
}

/** A boolean environment variable: 1/true on, 0/false/empty off. */
function switchedOn(env: NodeJS.ProcessEnv, variable: string): true | undefined {
  const raw = env[variable];
  if (raw !== undefined && !['', '0', '1', 'true', 'false'].includes(raw)) throw new UsageError(`${variable}: expected 1 or 0, got "${raw}"`);
  return raw === '1' || raw === 'true' ? true : undefined;
}

/** `--rag-model`, which means something only in gateway mode over a corpus. */
function ragModel(name: string | undefined, upstreams: readonly UpstreamOptions[] | undefined, corpus: string | undefined): string | undefined {
  if (name === undefined) return undefined;
  if (upstreams === undefined || corpus === undefined)
    throw new UsageError('--rag-model picks the upstream model that answers from --corpus: give --upstream and --corpus too');
  return name;
}

/** `--redact all` or a comma-separated list of kinds. */
function redactKinds(flag: string | undefined, variable: string | undefined): true | PiiKind[] | undefined {
  const raw = flag ?? (variable || undefined);
  if (raw === undefined) return undefined;
  const name = flag === undefined ? 'SLUICE_REDACT' : '--redact';
  if (raw.trim() === 'all') return true;
  const kinds = raw
    .split(',')
    .map((k) => k.trim())
    .filter((k) => k.length > 0);
  const unknown = kinds.filter((k) => !(PII_KINDS as readonly string[]).includes(k));
  if (kinds.length === 0 || unknown.length > 0)
    throw new UsageError(`${name}: expected all or some of ${PII_KINDS.join(', ')}${unknown.length > 0 ? `, got "${unknown.join(', ')}"` : ''}`);
  return kinds as PiiKind[];
}

/** Flags and environment → what `sluice worker` runs with. */
export function workerOptions(argv: readonly string[], env: NodeJS.ProcessEnv): { nats: string; models?: string; concurrency?: number; poolSize?: number } {
  const v = flagValues(argv);
  const nats = v.nats ?? (env.SLUICE_NATS || undefined);
  if (nats === undefined) throw new UsageError('sluice worker needs --nats <url> (or SLUICE_NATS)');
  const concurrency = integer(v, env, 'concurrency', 'SLUICE_CONCURRENCY');
  if (concurrency === 0) throw new UsageError('--concurrency: expected at least 1');
  return {
    nats,
    ...defined('models', v.models ?? (env.SLUICE_MODELS || undefined)),
    ...defined('concurrency', concurrency),
    ...defined('poolSize', integer(v, env, 'pool-size', 'SLUICE_POOL_SIZE')),
  };
}

function defined<K extends string, V>(key: K, value: V | undefined): { [P in K]?: V } {
  return (value === undefined ? {} : { [key]: value }) as { [P in K]?: V };
}

function version(): string {
  const path = findUp(import.meta.url, 'package.json');
  return path === undefined ? 'unknown' : (JSON.parse(readFileSync(path, 'utf8')) as { version: string }).version;
}

/** A command's options from its flags and environment; a bad one is printed (the caller exits 2) and undefined returned. */
function readOptions<T>(command: 'serve' | 'worker', read: () => T): T | undefined {
  try {
    return read();
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`sluice: ${err.message}\nRun "sluice ${command} --help" for the options.\n`);
    return undefined;
  }
}

/** Checks every peer this run needs before any module loads one; prints the missing ones and their install command. */
function peersInstalled(users: readonly PeerUser[]): boolean {
  try {
    requirePeers(...users);
    return true;
  } catch (err) {
    if (!(err instanceof MissingPeerError)) throw err;
    process.stderr.write(`sluice: ${err.message}\n`);
    return false;
  }
}

/** The command's log: JSON lines on stderr (pino), one per event and one per request. */
let logger: import('pino').Logger | undefined;
function getLogger(): import('pino').Logger {
  if (logger === undefined) {
    const pino = pinoPeer();
    // Synchronous writes: the last lines before an exit are not lost.
    logger = pino({ base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime }, pino.destination({ fd: 2, sync: true }));
  }
  return logger;
}

function log(line: string): void {
  getLogger().info(line);
}

/** One line per request: failures at `error`, refusals at `warn`, the rest at `info`. Never a prompt, a token or a key. */
function logRequest(entry: RequestLogEntry): void {
  const level = entry.outcome === 'failed' ? 'error' : entry.outcome === 'refused' ? 'warn' : 'info';
  getLogger()[level]({ request: entry }, 'request');
}

/** Runs the command; resolves with the exit code once the server stopped (or at once, for --help and errors). */
export async function main(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '-h' || command === '--help' || command === 'help') {
    process.stdout.write(HELP);
    return command === undefined ? 2 : 0;
  }
  if (command === '-v' || command === '--version') {
    process.stdout.write(`${version()}\n`);
    return 0;
  }
  if (command === 'worker') return worker(rest, env);
  if (command !== 'serve') {
    process.stderr.write(`sluice: unknown command "${command}"\n\n${HELP}`);
    return 2;
  }
  const options = readOptions('serve', () => serveOptions(rest, env));
  if (options === undefined) return 2;
  if (rest.includes('--help') || rest.includes('-h')) {
    process.stdout.write(HELP);
    return 0;
  }
  if (rest.includes('--version') || rest.includes('-v')) {
    process.stdout.write(`${version()}\n`);
    return 0;
  }

  const needs: PeerUser[] = ['sluice serve'];
  if (options.localModels !== undefined) needs.push('sluice serve --model <dir>');
  if (options.nats !== undefined) needs.push('sluice serve --nats <url>');
  if (!peersInstalled(needs)) return 1;

  let running: RunningServer;
  let remote: { close(): Promise<void> } | undefined;
  try {
    const { startServer } = await import('./serve/app.js');
    const { nats, ...serve } = options;
    if (nats !== undefined && serve.upstreams !== undefined) throw new UsageError('give --nats or --upstream, not both');
    if (serve.upstreams !== undefined) log(`gateway mode: upstreams ${serve.upstreams.map((u) => u.name ?? new URL(u.baseUrl).host).join(', ')}`);
    if (nats !== undefined) {
      // Loaded only with --nats: plain `sluice serve` needs no NATS package.
      const connected = await (await import('./nats/processes.js')).connectRemoteModel(nats);
      remote = connected;
      log(`generation runs on the workers of link charlm at ${nats}`);
      running = await startServer({ ...serve, log, requestLog: logRequest, languageModel: connected.model });
    } else {
      running = await startServer({ ...serve, log, requestLog: logRequest });
    }
  } catch (err) {
    await remote?.close().catch(() => {});
    if ((err as { code?: unknown }).code === 'LOCAL_MODEL_INVALID') {
      process.stderr.write(`sluice: --model: ${err instanceof Error ? err.message : String(err)}\n`);
      return 2;
    }
    if ((err as { code?: unknown }).code === 'INVALID_CORPUS') {
      const name = rest.some((arg) => arg === '--corpus' || arg.startsWith('--corpus=')) ? '--corpus' : 'SLUICE_CORPUS';
      const { directory, problem, hint } = err as { directory: string; problem: string; hint: string };
      process.stderr.write(`sluice: ${name} ${directory}: ${problem}\n  ${hint}\n`);
      return 2;
    }
    if (err instanceof UsageError || err instanceof InvalidOptionsError) {
      // An option only the running server can check (an upstream's model list) is named by its flag.
      const flag = err instanceof InvalidOptionsError && err.issues.length === 1 ? FLAG_OF[err.issues[0]!.path] : undefined;
      const message = flag === undefined ? err.message : `${flag}: ${(err as InvalidOptionsError).issues[0]!.message}`;
      process.stderr.write(`sluice: ${message}\nRun "sluice serve --help" for the options.\n`);
      return 2;
    }
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
      process.stderr.write(`sluice: cannot listen on ${options.host ?? '127.0.0.1'}:${options.port ?? 8787} (${code}); choose another --port or --host\n`);
      return 1;
    }
    const message = err instanceof Error ? err.message : String(err);
    const hint =
      typeof (err as { hint?: unknown }).hint === 'string' && !message.includes((err as { hint: string }).hint) ? `\n  ${(err as { hint: string }).hint}` : '';
    process.stderr.write(`sluice: failed to start: ${message}${hint}\n`);
    return 1;
  }

  const auth =
    options.tokens === undefined || Object.keys(options.tokens).length === 0
      ? 'none (open: loopback only)'
      : `bearer token (${Object.keys(options.tokens).length} accepted)`;
  const [model] = running.models;
  process.stdout.write(
    [
      `sluice ${version()} listening on ${running.url}`,
      `  chat page    ${running.url}/`,
      `  WebSocket    ${running.wsUrl}  (subprotocol ${SUBPROTOCOL})`,
      `  OpenAI API   ${running.url}/v1  (models: ${running.models.join(', ')})`,
      `  metrics      ${running.url}/metrics   health: /healthz, /readyz`,
      ...(options.inspect === false ? [] : [`  inspector    ${running.url}/inspect  (live stages, requests, sockets)`]),
      `  auth         ${auth}`,
      `try:`,
      `  curl -N ${running.url}/v1/chat/completions -H 'content-type: application/json' \\`,
      `    -d '{"model":"${model}","stream":true,"messages":[{"role":"user","content":"How does a stage pause a fast producer?"}]}'`,
      `SIGTERM or Ctrl-C stops it gracefully.`,
      '',
    ].join('\n'),
  );

  return new Promise<number>((resolve) => {
    let signalled = false;
    const stop = (signal: NodeJS.Signals) => {
      if (signalled) {
        log(`${signal} again: exiting at once`);
        return resolve(130);
      }
      signalled = true;
      log(`${signal} received`);
      running
        .shutdown()
        .then(() => remote?.close())
        .then(
          () => resolve(0),
          (err: unknown) => {
            log(`shutdown failed: ${err instanceof Error ? err.message : String(err)}`);
            resolve(1);
          },
        );
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });
}

/** `sluice worker`: serves the language model to `sluice serve --nats` until SIGTERM or SIGINT. */
async function worker(argv: readonly string[], env: NodeJS.ProcessEnv): Promise<number> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(HELP);
    return 0;
  }
  const options = readOptions('worker', () => workerOptions(argv, env));
  if (options === undefined) return 2;
  if (!peersInstalled(['sluice worker'])) return 1;
  let running: Awaited<ReturnType<typeof import('./nats/processes.js').startModelWorker>>;
  try {
    running = await (await import('./nats/processes.js')).startModelWorker({ ...options, log });
  } catch (err) {
    if ((err as { code?: string }).code === 'MISSING_PEER') throw err;
    process.stderr.write(`sluice: the worker failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
    return 1;
  }
  process.stdout.write(`sluice ${version()} worker: serving charlm to ${options.nats}\n`);
  return new Promise<number>((resolve) => {
    const stop = (signal: NodeJS.Signals) => {
      log(`${signal} received: handing requests in flight back to the link`);
      running.stop().then(
        () => resolve(0),
        () => resolve(1),
      );
    };
    process.once('SIGTERM', stop);
    process.once('SIGINT', stop);
    running.server.done.catch((err: unknown) => {
      log(`the link failed: ${err instanceof Error ? err.message : String(err)}`);
      resolve(1);
    });
  });
}
