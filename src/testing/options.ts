/** The test kit's options, checked when a probe or a wait is made: a misspelt field fails naming it, like every option of sluice. */
import type { VirtualTimeScheduler } from 'rxjs';
import { lazySchema, type ZodModule } from '../core/zod.js';
import { functionSchema, parseOptions } from '../flow/options.js';

const sinkFields = (z: ZodModule) => ({
  unwrap: z.boolean({ error: 'unwrap must be a boolean' }).optional(),
  request: z.number({ error: 'request must be a number' }).int({ error: 'request must be an integer' }).min(0, { error: 'request must be ≥ 0' }).optional(),
});

const waitFields = (z: ZodModule) => ({
  maxTicks: z.number({ error: 'maxTicks must be a number' }).int({ error: 'maxTicks must be an integer' }).min(0, { error: 'maxTicks must be ≥ 0' }).optional(),
  tick: functionSchema<() => unknown>().optional(),
});

const sinkSchema = lazySchema((z) => z.strictObject(sinkFields(z)));
const waitSchema = lazySchema((z) => z.strictObject(waitFields(z)));
const verifySchema = lazySchema((z) =>
  z.strictObject({
    ...sinkFields(z),
    ...waitFields(z),
    scheduler: z
      .custom<VirtualTimeScheduler>((v) => typeof v === 'object' && v !== null && typeof (v as VirtualTimeScheduler).flush === 'function' && 'maxFrames' in v, {
        error: 'scheduler must be a VirtualTimeScheduler (or an RxJS TestScheduler)',
      })
      .optional(),
  }),
);

export const checkSinkOptions = (options: unknown): void => void parseOptions(sinkSchema(), options, 'TestSink options');
export const checkWaitOptions = (options: unknown): void => void parseOptions(waitSchema(), options, 'wait options');
export const checkVerifyOptions = (options: unknown): void => void parseOptions(verifySchema(), options, 'verify options');
