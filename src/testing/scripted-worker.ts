/**
 * `ScriptedWorker`: a `ModelWorker` for tests, with no model behind it. It echoes the prompt,
 * counts (`t0 `, `t1 `...) or says scripted tokens, waits scripted delays on an injectable
 * scheduler, fails or hangs at a chosen token, and honours demand, `max_tokens`, stop sequences
 * and abort exactly as the real workers do, because it steps through the same `decode`.
 */
import { asyncScheduler, type SchedulerLike } from 'rxjs';
import type { Flow } from '../flow/demand.js';
import { functionSchema, parseOptions, schedulerSchema } from '../flow/options.js';
import { lazySchema } from '../core/zod.js';
import {
  complete,
  decode,
  generateRequest,
  promptText,
  type Completion,
  type DecodeStep,
  type EndReason,
  type GenerateOptions,
  type GenerateRequest,
  type InferOptions,
  type ModelWorker,
  type Token,
} from '../ai/inference/worker.js';

/**
 * What a generation says: `'count'` (`t0 `, `t1 `... until `max_tokens` or abort), `'echo'` (the
 * prompt, word by word), a list of tokens, one token over and over (`{ repeat: 'x' }`), or a
 * function giving the tokens of each generation (any iterable, endless ones too; `generation`
 * counts from 0).
 */
export type Script = 'count' | 'echo' | readonly string[] | { readonly repeat: string } | ((request: GenerateRequest, generation: number) => Iterable<string>);

/** How long before each token: milliseconds on the scheduler, or `'turn'` (one `setImmediate`). */
export type ScriptedDelay = number | 'turn' | ((token: number) => number | 'turn');

/** Options of `ScriptedWorker`: what it says, how fast, and where it fails or hangs. */
export interface ScriptedWorkerOptions {
  /** The worker's name (its model name on a server). Default `'scripted'`. */
  readonly name?: string;
  /** What each generation says. Default `'count'`. */
  readonly tokens?: Script;
  /** Pads every token with `.` to this many characters (for tests on bytes). */
  readonly padTo?: number;
  /** Before each token; default none (each step resolves in a microtask). */
  readonly delay?: ScriptedDelay;
  /** Where millisecond delays are scheduled (an RxJS `TestScheduler` for virtual time). Default `asyncScheduler`. */
  readonly scheduler?: SchedulerLike;
  /** Fails the generation instead of its token number `after` (0: before the first), with `error`; only requests `when` picks (default all). */
  readonly fail?: {
    /** Tokens given before the failure. */
    readonly after: number;
    /** What the generation fails with. */
    readonly error?: unknown;
    /** Picks the requests that fail (default all). */
    readonly when?: (request: GenerateRequest) => boolean;
  };
  /** Waits, before token number `after`, until the generation is aborted (a request that cannot finish by itself); only requests `when` picks. */
  readonly hang?: {
    /** Tokens given before the hang. */
    readonly after: number;
    /** Picks the requests that hang (default all). */
    readonly when?: (request: GenerateRequest) => boolean;
  };
  /** Prompt tokens reported in usage. Default: the prompt's words. */
  readonly inputTokens?: number;
  /** Tokens after which a request without `max_tokens` ends with `length`. Default: none. */
  readonly maxTokens?: number;
  /** False: ignores `max_tokens` (a custom worker with a bug, for testing the server's cap). Default true. */
  readonly honourMaxTokens?: boolean;
  /** How a finite script ends. Default `'stop'`. */
  readonly end?: EndReason;
  /** Advertised as the worker's `contextLength`. */
  readonly contextLength?: number;
}

/** One generation as the worker saw it. */
export interface ScriptedGeneration {
  readonly request: GenerateRequest;
  readonly signal: AbortSignal | undefined;
  readonly trace: GenerateOptions['trace'];
  /** Steps the consumer's demand made it take (tokens, plus the end or failure). */
  steps: number;
}

const optionsSchema = lazySchema((z) => {
  const count = (what: string) =>
    z
      .number({ error: `${what} must be a number` })
      .int({ error: `${what} must be an integer` })
      .min(0, { error: `${what} must be ≥ 0` });
  const script = z.union([z.literal(['count', 'echo']), z.array(z.string()), z.object({ repeat: z.string() }).strict(), functionSchema()], {
    error: "tokens must be 'count', 'echo', an array of strings, { repeat } or a function",
  });
  const delay = z.union([z.number().min(0), z.literal('turn'), functionSchema()], {
    error: "delay must be a number of milliseconds ≥ 0, 'turn' or a function",
  });
  return z
    .object({
      name: z.string({ error: 'name must be a string' }).min(1, { error: 'name must not be empty' }).optional(),
      tokens: script.optional(),
      padTo: count('padTo').optional(),
      delay: delay.optional(),
      scheduler: schedulerSchema().optional(),
      fail: z
        .object(
          { after: count('fail.after'), error: z.unknown().optional(), when: functionSchema().optional() },
          { error: 'fail must be { after, error?, when? }' },
        )
        .strict()
        .optional(),
      hang: z
        .object({ after: count('hang.after'), when: functionSchema().optional() }, { error: 'hang must be { after, when? }' })
        .strict()
        .optional(),
      inputTokens: count('inputTokens').optional(),
      maxTokens: count('maxTokens').min(1, { error: 'maxTokens must be ≥ 1' }).optional(),
      honourMaxTokens: z.boolean({ error: 'honourMaxTokens must be a boolean' }).optional(),
      end: z.enum(['stop', 'length', 'tool_calls', 'content_filter'], { error: "end must be 'stop', 'length', 'tool_calls' or 'content_filter'" }).optional(),
      contextLength: count('contextLength').min(1, { error: 'contextLength must be ≥ 1' }).optional(),
    })
    .strict();
});

function* counting(): Generator<string> {
  for (let n = 0; ; n++) yield `t${n} `;
}

function* repeating(text: string): Generator<string> {
  for (;;) yield text;
}

const words = (text: string): string[] => text.match(/\S+\s*/g) ?? [];

/**
 * A scripted model worker for tests: serve it (`createHttpHandler({ worker })`,
 * `attachTokenSocket`, `serveModel`) or call it, then check what it was asked.
 *
 * ## Example
 * ```ts
 * import { ScriptedWorker } from 'sluice/testing/ai';
 *
 * const worker = new ScriptedWorker({ tokens: ['Hello', ', ', 'world'], delay: 'turn' });
 * const { text, finishReason } = await worker.infer({ prompt: 'Say hello' }); // 'Hello, world', 'stop'
 * const failing = new ScriptedWorker({ fail: { after: 2, error: new Error('device lost') } });
 * ```
 */
export class ScriptedWorker implements ModelWorker<GenerateRequest, Completion> {
  readonly name: string;
  readonly contextLength: number | undefined;
  /** Every generation started, oldest first. */
  readonly generations: ScriptedGeneration[] = [];
  /** Steps taken over every generation. */
  steps = 0;
  private readonly options: ScriptedWorkerOptions;
  private readonly scheduler: SchedulerLike;

  constructor(options: ScriptedWorkerOptions = {}) {
    this.options = parseOptions(optionsSchema(), options, 'ScriptedWorker options') as ScriptedWorkerOptions;
    this.name = this.options.name ?? 'scripted';
    this.contextLength = this.options.contextLength;
    this.scheduler = this.options.scheduler ?? asyncScheduler;
  }

  /** The requests, validated, in the order they came. */
  get requests(): GenerateRequest[] {
    return this.generations.map((g) => g.request);
  }

  /** The latest generation. */
  last(): ScriptedGeneration {
    const last = this.generations.at(-1);
    if (last === undefined) throw new Error(`${this.name}: no generation has started`);
    return last;
  }

  generate(request: GenerateRequest, options: GenerateOptions = {}): Flow<Token> {
    const valid = generateRequest(request);
    const { signal, trace } = options;
    const generation: ScriptedGeneration = { request: valid, signal, trace, steps: 0 };
    const index = this.generations.push(generation) - 1;
    const honour = this.options.honourMaxTokens ?? true;
    const maxTokens = honour ? (valid.max_tokens ?? this.options.maxTokens) : undefined;
    const { fail, hang } = this.options;
    const failAt = fail !== undefined && (fail.when?.(valid) ?? true) ? fail.after : Infinity;
    const hangAt = hang !== undefined && (hang.when?.(valid) ?? true) ? hang.after : Infinity;
    return decode(valid, options, { name: this.name, maxTokens }, () => {
      const tokens = this.script(valid, index)[Symbol.iterator]();
      let n = 0;
      return {
        inputTokens: this.options.inputTokens ?? words(promptText(valid)).length,
        step: (stepSignal) => {
          generation.steps++;
          this.steps++;
          const token = n++;
          return this.wait(token, stepSignal).then(() => {
            if (token >= failAt) throw fail!.error ?? new Error(`${this.name} failed as scripted, before token ${token}`);
            if (token >= hangAt) return aborted(stepSignal);
            return this.next(tokens);
          });
        },
        close: () => {},
      };
    });
  }

  infer(input: GenerateRequest, options: InferOptions = {}): Promise<Completion> {
    return complete((onDone) => this.generate(input, { ...options, onDone }));
  }

  private script(request: GenerateRequest, generation: number): Iterable<string> {
    const script = this.options.tokens ?? 'count';
    if (script === 'count') return counting();
    if (script === 'echo') return words(promptText(request));
    if (typeof script === 'function') return script(request, generation);
    if ('repeat' in script) return repeating(script.repeat);
    return script;
  }

  private next(tokens: Iterator<string>): DecodeStep {
    const next = tokens.next();
    if (next.done === true) return { end: this.options.end ?? 'stop' };
    const padTo = this.options.padTo;
    return { text: padTo === undefined ? next.value : next.value.padEnd(padTo, '.') };
  }

  private wait(token: number, signal: AbortSignal): Promise<void> {
    const option = this.options.delay;
    const delay = typeof option === 'function' ? option(token) : option;
    if (delay === undefined) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        cancel();
        reject(signal.reason);
      };
      let cancel: () => void;
      if (delay === 'turn') {
        const immediate = setImmediate(done);
        cancel = () => clearImmediate(immediate);
      } else {
        const action = this.scheduler.schedule(done, delay);
        cancel = () => action.unsubscribe();
      }
      signal.addEventListener('abort', onAbort, { once: true });
      function done(): void {
        signal.removeEventListener('abort', onAbort);
        resolve();
      }
    });
  }
}

/** Settles only when `signal` aborts, rejecting with its reason. */
function aborted(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) return reject(signal.reason);
    signal.addEventListener('abort', () => reject(signal.reason), { once: true });
  });
}
