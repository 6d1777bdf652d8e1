/**
 * `sluice/nats` — links between stages that cross processes and machines over NATS JetStream,
 * with demand carried across: a producer publishes only as the link has room, a receiver pulls
 * only what its pipeline asked for. Needs the optional peer `@nats-io/jetstream` (and a
 * connection, e.g. from `@nats-io/transport-node`).
 *
 * @module
 */
import './peers-nats.js'; // first: without @nats-io/jetstream, the import fails here, naming it
export { openLink, LinkError } from './nats/link.js';
export type { Link, LinkConfig, LinkErrorCode, LinkOptions } from './nats/link.js';
export { toLink } from './nats/publish.js';
export type { PublishSummary, ToLinkOptions } from './nats/publish.js';
export { fromLink, linkMessageOf, LinkReceiverStats } from './nats/source.js';
export type { FromLinkOptions, LinkMessage } from './nats/source.js';
export { remoteModel, RemoteGenerationError } from './nats/remote-model.js';
export type { RemoteModelOptions } from './nats/remote-model.js';
export { serveModel } from './nats/model-server.js';
export type { ModelServer, ServeModelOptions } from './nats/model-server.js';
export { openModelLink } from './nats/remote-protocol.js';
export type { RemoteRequest } from './nats/remote-protocol.js';
export { checkLink, jsonSchemaOf } from './nats/contract.js';
export type { LinkContract, Side } from './nats/contract.js';
export type { JsonSchema } from './nats/schema-subset.js';
