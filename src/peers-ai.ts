import { requirePeers } from './core/peers.js';

// Evaluated before every other module of `sluice/ai` (its first import): every missing peer named at once.
requirePeers('sluice/ai');
