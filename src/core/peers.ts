import { createRequire } from 'node:module';
import { MissingPeerError } from './errors.js';
import { type PeerUser, namedUsers, peersOf } from './peer-list.js';

/**
 * Optional peer dependencies, loaded with `require` when the module that needs them is
 * imported: a static `import` of a missing package fails while Node links the module
 * graph, before any of our code can say which package to install.
 */
const load = createRequire(import.meta.url);
const loaded = new Map<string, unknown>();

function peer<T>(name: string, entry: string, path = name): T {
  if (loaded.has(path)) return loaded.get(path) as T;
  let module: T;
  try {
    module = load(path) as T;
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code === 'MODULE_NOT_FOUND' || code === 'ERR_MODULE_NOT_FOUND') throw new MissingPeerError(name, entry, error);
    throw error;
  }
  loaded.set(path, module);
  return module;
}

/**
 * Fails with one `MissingPeerError` naming every package the users need (peer-list.ts) that cannot
 * be found, and the one command installing them all; loads nothing. What a need loads later, on
 * first use, is then there: a missing peer fails the import or the start, never a request.
 */
export function requirePeers(...users: readonly PeerUser[]): void {
  const needed = [...new Set(users.flatMap((user) => peersOf(user)))];
  const missing = needed.filter((name) => {
    if (loaded.has(name)) return false;
    try {
      load.resolve(name);
      return false;
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      if (code === 'MODULE_NOT_FOUND' || code === 'ERR_MODULE_NOT_FOUND') return true;
      throw error;
    }
  });
  if (missing.length > 0) throw new MissingPeerError(missing, namedUsers(users));
}

export const onnxruntime = (): typeof import('onnxruntime-node') => peer('onnxruntime-node', 'sluice/ai');
export const wsPeer = (): typeof import('ws') => peer('ws', 'sluice/serve');
export const promClient = (): typeof import('prom-client') => peer('prom-client', 'sluice/serve');
export const otelApi = (): typeof import('@opentelemetry/api') => peer('@opentelemetry/api', 'sluice/serve');
export const natsJetstream = (): typeof import('@nats-io/jetstream') => peer('@nats-io/jetstream', 'sluice/nats');
export const natsTransport = (): typeof import('@nats-io/transport-node') => peer('@nats-io/transport-node', 'sluice/nats');
export const hfTokenizers = (): typeof import('@huggingface/tokenizers') =>
  peer('@huggingface/tokenizers', "sluice/ai's loadTokenizer (a Hugging Face tokenizer.json)");
export const hfJinja = (): typeof import('@huggingface/jinja') => peer('@huggingface/jinja', "sluice/ai's loadLocalModel (a chat template)");
/** The light entry and one encoding's ranks: the full entry would load every encoding. */
export const jsTiktoken = (): typeof import('js-tiktoken/lite') => peer('js-tiktoken', "sluice/ai's openAiTokenCounter", 'js-tiktoken/lite');
export const tiktokenRanks = (encoding: string): import('js-tiktoken/lite').TiktokenBPE => {
  const ranks = peer<import('js-tiktoken/lite').TiktokenBPE & { default?: import('js-tiktoken/lite').TiktokenBPE }>(
    'js-tiktoken',
    "sluice/ai's openAiTokenCounter",
    `js-tiktoken/ranks/${encoding}`,
  );
  return ranks.default ?? ranks;
};
export const hdrHistogram = (): typeof import('hdr-histogram-js') => peer('hdr-histogram-js', "sluice/serve's inspector");
export const pinoPeer = (): typeof import('pino') => peer('pino', 'the sluice command');
