import { onnxruntime } from './core/peers.js';

// Evaluated before every other module of `sluice/ai` (its first import).
onnxruntime();
