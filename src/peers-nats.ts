import { natsJetstream } from './core/peers.js';

// Evaluated before every other module of `sluice/nats` (its first import).
natsJetstream();
