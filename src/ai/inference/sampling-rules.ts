/**
 * The rules of the generation parameters, written once: `generateRequest` takes each field as
 * optional, the OpenAI wire as nullable (and narrows `temperature` to OpenAI's [0, 2]); the
 * WebSocket and NATS requests go through `generateRequest`.
 */
import { lazySchema } from '../../core/zod.js';

/** @internal The generation parameters' schemas, one per field. */
export const samplingRules = lazySchema((z) => {
  const penalty = (name: string) =>
    z
      .number({ error: `${name} must be a number` })
      .min(-2, { error: `${name} must be in [-2, 2]` })
      .max(2, { error: `${name} must be in [-2, 2]` });
  return {
    temperature: z.number({ error: 'temperature must be a number' }).min(0, { error: 'temperature must be ≥ 0' }),
    top_p: z.number({ error: 'top_p must be a number' }).gt(0, { error: 'top_p must be in (0, 1]' }).max(1, { error: 'top_p must be in (0, 1]' }),
    top_k: z.number({ error: 'top_k must be a number' }).int({ error: 'top_k must be an integer' }).min(0, { error: 'top_k must be ≥ 0' }),
    max_tokens: z.number({ error: 'max_tokens must be a number' }).int({ error: 'max_tokens must be an integer' }).min(1, { error: 'max_tokens must be ≥ 1' }),
    seed: z.number({ error: 'seed must be a number' }).int({ error: 'seed must be an integer' }),
    repetition_penalty: z.number({ error: 'repetition_penalty must be a number' }).gt(0, { error: 'repetition_penalty must be > 0' }),
    /** OpenAI's presence and frequency penalties: in [-2, 2], 0 (the default many clients send) changes nothing. */
    presence_penalty: penalty('presence_penalty'),
    frequency_penalty: penalty('frequency_penalty'),
  };
});
