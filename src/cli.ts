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
import { InvalidOptionsError, MissingPeerError, errorMessage } from './core/errors.js';
import { PRIORITY_CLASSES, type PriorityClass } from './core/vocabulary.js';
import { SUBPROTOCOL } from './serve/protocol.js';
// Types only: the server's modules load their peers, so they are imported once the peers are checked.
import type { RunningServer, ServeOptions } from './serve/app.js';
import type { UpstreamOptions } from './ai/inference/gateway.js';
import { PII_KINDS, type PiiKind } from './ai/stages/pii-detectors.js';
import { pinoPeer, requirePeers } from './core/peers.js';
import type { PeerUser } from './core/peer-list.js';
import type { RequestLogEntry } from './serve/request-log.js';
import { ruleViolations } from './serve/serve-rules.js';
import { type Command, FLAGS, type FlagValues, flagNamed, flagOf, given, helpFor, readFlags, UsageError } from './cli/flags.js';

const HELP = `Usage: sluice serve [options]

Starts the sluice server: a chat page, WebSocket token streams (${SUBPROTOCOL}), an
OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models),
the /inspect page, /metrics, /healthz and /readyz.

Options (environment variable in brackets):
${helpFor('serve')}
Usage: sluice worker --nats <url> [options]

Runs the language model for "sluice serve --nats": takes generation requests from the link
"charlm", streams the tokens back. Start as many as you like; they share the work.

${helpFor('worker')}`;

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

/** `--tenant-priority tenant:class`, repeatable. */
function tenantPriorities(entries: readonly string[]): Record<string, PriorityClass> {
  const map: Record<string, PriorityClass> = {};
  for (const entry of entries) {
    const colon = entry.lastIndexOf(':');
    const [tenant, level] = [entry.slice(0, colon), entry.slice(colon + 1)];
    if (colon <= 0 || !(PRIORITY_CLASSES as readonly string[]).includes(level))
      throw new UsageError(`--tenant-priority: expected "tenant:class" with a class of ${PRIORITY_CLASSES.join(', ')}, got "${entry}"`);
    map[tenant] = level as PriorityClass;
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

/** Flags and environment → `ServeOptions`, and the NATS URL generation goes to, if any. */
export function serveOptions(argv: readonly string[], env: NodeJS.ProcessEnv): ServeOptions & { nats?: string } {
  const values = readFlags(argv);
  const { options, sources } = mapped('serve', values, env);
  const flagFields = new Map<string, string>();
  // The options parsed from their flag rather than copied; each remembers where it came from, for errors.
  const parsed = (name: string, field: string, parse: (value: never, source: string) => unknown): void => {
    flagFields.set(field, `--${name}`);
    const value = given(flagNamed(name), values, env);
    if (value === undefined) return;
    setPath(options, field, parse(value.value as never, value.source));
    if (!sources.has(field)) sources.set(field, value.source);
  };
  parsed('upstream', 'upstreams', (specs: string[]) => specs.map((spec) => parseUpstream(spec, env)));
  parsed('token', 'tokens', (list: string[]) => tokens(list));
  parsed('tenant-priority', 'tenantPriorities', (list: string[]) => tenantPriorities(list));
  parsed('rate', 'limits.rate', (rate: number) => ({ perSecond: rate, burst: rate * 2 }));
  parsed('tenant-rate', 'limits.tenantRate', (rate: number) => ({ perSecond: rate, burst: rate * 2 }));
  parsed('model', 'localModels', (dirs: string[]) => {
    if (dirs.some((dir) => dir.trim().length === 0)) throw new UsageError('--model: expected a directory');
    return dirs;
  });
  parsed('cache-mb', 'gateway', (mb: number) => ({ cache: { maxBytes: mb * 2 ** 20 }, singleFlight: true }));
  parsed('no-inspect', 'inspect', () => false);
  parsed('redact', 'redact', (raw: string, source) => redactKinds(raw, source));
  // Generation over NATS is the server's languageModel: the server's rules name it by its flag here.
  const name = (field: string) =>
    sources.get(field) ?? [...sources].find(([path]) => path.startsWith(`${field}.`))?.[1] ?? flagFields.get(field) ?? flagOf(field) ?? field;
  const [broken] = ruleViolations({ ...options, languageModel: options.nats }, (field) => (field === 'languageModel' ? '--nats' : name(field)));
  if (broken !== undefined) throw new UsageError(broken.message);
  return options as ServeOptions & { nats?: string };
}

/** The options of the flags of `command` that map straight to one (`to`), and the flag or variable each came from. */
function mapped(command: Command, values: FlagValues, env: NodeJS.ProcessEnv): { options: Record<string, unknown>; sources: Map<string, string> } {
  const options: Record<string, unknown> = {};
  const sources = new Map<string, string>();
  for (const flag of FLAGS) {
    if (flag.to === undefined || flag.help[command] === undefined) continue;
    const value = given(flag, values, env);
    if (value === undefined) continue;
    setPath(options, flag.to, value.value);
    sources.set(flag.to, value.source);
  }
  return { options, sources };
}

/** Sets `value` at a dotted `path`, merging into the objects on the way. */
function setPath(target: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split('.');
  const last = keys.pop()!;
  let at = target;
  for (const key of keys) at = (at[key] ??= {}) as Record<string, unknown>;
  const current = at[last];
  at[last] =
    typeof current === 'object' && current !== null && typeof value === 'object' && value !== null && !Array.isArray(value) ? { ...current, ...value } : value;
}

/** `--redact all` or a comma-separated list of kinds. */
function redactKinds(raw: string, name: string): true | PiiKind[] {
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
export function workerOptions(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
): { nats: string; models?: string; concurrency?: number; poolSize?: number; maxBatch?: number } {
  const { options } = mapped('worker', readFlags(argv), env);
  if (options.nats === undefined) throw new UsageError('sluice worker needs --nats <url> (or SLUICE_NATS)');
  return options as { nats: string; models?: string; concurrency?: number; poolSize?: number; maxBatch?: number };
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
  if (options.embedModel !== undefined) needs.push('sluice serve --embed-model <dir>');
  if (options.nats !== undefined) needs.push('sluice serve --nats <url>');
  if (!peersInstalled(needs)) return 1;

  let running: RunningServer;
  let remote: { close(): Promise<void> } | undefined;
  try {
    const { startServer } = await import('./serve/app.js');
    const { nats, ...serve } = options;
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
      process.stderr.write(`sluice: --model: ${errorMessage(err)}\n`);
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
      const flag = err instanceof InvalidOptionsError && err.issues.length === 1 ? flagOf(err.issues[0]!.path) : undefined;
      const message = flag === undefined ? err.message : `${flag}: ${(err as InvalidOptionsError).issues[0]!.message}`;
      process.stderr.write(`sluice: ${message}\nRun "sluice serve --help" for the options.\n`);
      return 2;
    }
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE' || code === 'EACCES' || code === 'EADDRNOTAVAIL') {
      process.stderr.write(`sluice: cannot listen on ${options.host ?? '127.0.0.1'}:${options.port ?? 8787} (${code}); choose another --port or --host\n`);
      return 1;
    }
    const message = errorMessage(err);
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
            log(`shutdown failed: ${errorMessage(err)}`);
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
    process.stderr.write(`sluice: the worker failed to start: ${errorMessage(err)}\n`);
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
      log(`the link failed: ${errorMessage(err)}`);
      resolve(1);
    });
  });
}
