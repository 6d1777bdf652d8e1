/**
 * The optional peers each entry point and command needs, declared once. The import-time checks
 * (src/peers-*.ts), the command's start-up check (src/cli.ts), the README's install table and the
 * consumer test all follow this list; marble-tests/package/peers.test.ts fails when the README differs.
 */

/** Every optional peer a need may name. */
export type PeerName =
  | 'onnxruntime-node'
  | 'ws'
  | 'prom-client'
  | '@opentelemetry/api'
  | 'hdr-histogram-js'
  | 'pino'
  | '@huggingface/tokenizers'
  | '@huggingface/jinja'
  | 'js-tiktoken'
  | '@nats-io/jetstream'
  | '@nats-io/transport-node';

/** How each peer is installed: a bare name, or a range where the newest release does not run on Node 20. */
export const INSTALL_SPECS: Readonly<Record<PeerName, string>> = {
  'onnxruntime-node': 'onnxruntime-node',
  ws: 'ws',
  'prom-client': 'prom-client',
  '@opentelemetry/api': '@opentelemetry/api',
  'hdr-histogram-js': 'hdr-histogram-js',
  pino: 'pino',
  '@huggingface/tokenizers': '@huggingface/tokenizers',
  '@huggingface/jinja': '@huggingface/jinja',
  'js-tiktoken': 'js-tiktoken',
  // 3.4's nuid declares Node ≥ 22.
  '@nats-io/jetstream': '@nats-io/jetstream@~3.3.1',
  '@nats-io/transport-node': '@nats-io/transport-node@~3.3.1',
};

/** What one user of sluice — an entry point, a command, a command with a flag — installs beside it. */
export interface PeerNeed {
  /** As the README's install table names it. */
  readonly user: string;
  /** Another need whose packages this one needs as well (a command's, for one of its flags). */
  readonly base?: string;
  /** Installed beside sluice (and beside `base`'s). */
  readonly packages: readonly PeerName[];
}

/** In the README's order. */
export const PEER_NEEDS = [
  { user: 'sluice', packages: [] },
  { user: 'sluice/testing', packages: [] },
  { user: 'sluice/testing/ai', packages: [] },
  { user: 'sluice/ai', packages: ['onnxruntime-node'] },
  { user: 'sluice/serve', packages: ['onnxruntime-node', 'ws', 'prom-client', '@opentelemetry/api', 'hdr-histogram-js'] },
  { user: 'sluice/nats', packages: ['@nats-io/jetstream', '@nats-io/transport-node'] },
  { user: 'sluice serve', base: 'sluice/serve', packages: ['pino'] },
  { user: 'sluice serve --model <dir>', base: 'sluice serve', packages: ['@huggingface/tokenizers', '@huggingface/jinja'] },
  { user: 'sluice serve --embed-model <dir>', base: 'sluice serve', packages: ['@huggingface/tokenizers'] },
  { user: 'sluice serve --nats <url>', base: 'sluice serve', packages: ['@nats-io/jetstream', '@nats-io/transport-node'] },
  { user: 'sluice worker', packages: ['onnxruntime-node', 'pino', '@nats-io/jetstream', '@nats-io/transport-node'] },
] as const satisfies readonly PeerNeed[];

/** Peers no need requires: what works without them, as the start-up log says. */
export const OPTIONAL_EXTRAS: Readonly<Partial<Record<PeerName, string>>> = {
  'js-tiktoken': 'exact prompt counts for OpenAI models (sluice serve --upstream with --corpus); estimated without',
};

/** A user the list names. */
export type PeerUser = (typeof PEER_NEEDS)[number]['user'];

/** Every package `user` needs, its base's first, each once. */
export function peersOf(user: PeerUser): PeerName[] {
  const need: PeerNeed | undefined = PEER_NEEDS.find((n) => n.user === user);
  if (need === undefined) throw new RangeError(`no peer need is declared for "${user}"`);
  const base = need.base === undefined ? [] : peersOf(need.base as PeerUser);
  return [...new Set([...base, ...need.packages])];
}

/** `users` as one error names them: a command's need is left out beside one of its flags', which holds it. */
export function namedUsers(users: readonly PeerUser[]): string {
  const bases = new Set<string>();
  for (const user of users) {
    for (let need: PeerNeed | undefined = PEER_NEEDS.find((n) => n.user === user); need?.base !== undefined; ) {
      bases.add(need.base);
      need = PEER_NEEDS.find((n) => n.user === need!.base);
    }
  }
  return [...new Set(users)].filter((user) => !bases.has(user)).join(' and ');
}

/** The one command that installs `names`. */
export function installCommand(names: readonly string[]): string {
  return `npm install ${names.map((name) => INSTALL_SPECS[name as PeerName] ?? name).join(' ')}`;
}
