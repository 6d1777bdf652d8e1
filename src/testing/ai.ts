/**
 * `sluice/testing/ai` — the test kit's model worker: `ScriptedWorker` serves or answers like a
 * model (echo, scripted tokens, delays in virtual time, failures, hangs, abort) with no model
 * behind it. Apart from `sluice/testing` so that the core kit's types never reach the AI layer's;
 * it needs no optional peer.
 *
 * ## Example
 * ```ts
 * import { ScriptedWorker } from 'sluice/testing/ai';
 *
 * const worker = new ScriptedWorker({ tokens: 'echo', delay: 'turn' });
 * const { text } = await worker.infer({ prompt: 'hello there' }); // 'hello there'
 * ```
 * @module
 */
export { ScriptedWorker, type ScriptedWorkerOptions, type ScriptedGeneration, type Script, type ScriptedDelay } from './scripted-worker.js';
