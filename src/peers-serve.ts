import { otelApi, promClient, wsPeer } from './core/peers.js';

// Evaluated before every other module of `sluice/serve` (its first import).
wsPeer();
promClient();
otelApi();
