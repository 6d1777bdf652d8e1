import { requirePeers } from './core/peers.js';

// Evaluated before every other module of `sluice/nats` (its first import): every missing peer named at once.
requirePeers('sluice/nats');
