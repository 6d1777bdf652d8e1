/**
 * `redactedWorker(worker, options)`: the worker, with personal data (card numbers, IP
 * addresses, e-mails, phone numbers, your own patterns) redacted from the text of every
 * answer as it streams — across token boundaries, holding back only a tail that could still
 * become a match. In front of any model: an upstream's in gateway mode, for instance.
 */
import { EMPTY, concat, defer, filter, map, of, type MonoTypeOperatorFunction, type Observable } from 'rxjs';
import type { Flow } from '../../flow/demand.js';
import { asFlow } from '../../resilience/as-flow.js';
import type { RedactOptions, RedactStats } from '../stages/redact-options.js';
import { Redactor } from '../stages/redactor.js';
import { complete, type Completion, type GenerateOptions, type GenerateRequest, type InferOptions, type ModelWorker, type Token } from '../inference/worker.js';

/** What `redactTokens` and `redactedWorker` take: `redact`'s detectors and bound, and counters to share. */
export type RedactTokensOptions = Pick<RedactOptions, 'detect' | 'replacements' | 'patterns' | 'maxHold'> & {
  /** Counted here: tokens received, chunks emitted, matches replaced per kind, forced releases. */
  readonly stats?: RedactStats;
};

/**
 * Redacts the text of a token stream (one answer). Tokens whose text is held back are
 * not emitted; the held text comes out with a later token, or as one last token when
 * the answer ends. A token that carries a `delta` (a tool call) ends the text: what was
 * held goes out with it, unredacted tool-call arguments untouched. Indexes are renumbered
 * so they stay consecutive; `logprob` is kept only on a token whose text came out as it was.
 *
 * Demand passes through: the operators are plain (`map`, `filter`, `concat`), subscribed in
 * the consumer's link scope.
 *
 * ## Example
 * ```ts
 * worker.generate(request).pipe(redactTokens({ detect: ['email'] })).subscribe((t) => process.stdout.write(t.text));
 * ```
 */
export function redactTokens(options: RedactTokensOptions = {}): MonoTypeOperatorFunction<Token> {
  const { stats, ...redactorOptions } = options;
  // Built once, so bad options fail when the operator is made, not per answer.
  new Redactor(redactorOptions);
  return (source: Observable<Token>) =>
    defer(() => {
      const redactor = new Redactor(redactorOptions);
      let index = 0;
      const counted = () => {
        if (stats === undefined) return;
        for (const [kind, n] of Object.entries(redactor.takeCounts())) stats.redacted[kind] = (stats.redacted[kind] ?? 0) + n;
        stats.forced += redactor.forced;
        redactor.forced = 0;
      };
      const out = (token: Token | undefined, text: string): Token | undefined => {
        counted();
        if (text === '' && token?.delta === undefined) return undefined;
        if (stats !== undefined) stats.emittedCount++;
        const kept = token !== undefined && text === token.text && token.logprob !== undefined;
        return { text, index: index++, ...(kept && { logprob: token.logprob }), ...(token?.delta !== undefined && { delta: token.delta }) };
      };
      return concat(
        source.pipe(
          map((token) => {
            if (stats !== undefined) {
              stats.receivedCount++;
              stats.deliveredCount++;
            }
            const text = redactor.push(token.text);
            return out(token, token.delta === undefined ? text : text + redactor.flush());
          }),
          filter((token): token is Token => token !== undefined),
        ),
        defer(() => {
          const last = out(undefined, redactor.flush());
          return last === undefined ? EMPTY : of(last);
        }),
      );
    });
}

/**
 * Wraps `worker` so every answer's text is redacted (`redactTokens`). Its name,
 * `passthrough` and `stages` are kept; usage still reports what the model generated.
 *
 * ## Example
 * ```ts
 * const safe = redactedWorker(upstream, { detect: ['email', 'phone'] });
 * ```
 */
export function redactedWorker(worker: ModelWorker<GenerateRequest, Completion>, options: RedactTokensOptions = {}): ModelWorker<GenerateRequest, Completion> {
  const operator = redactTokens(options);
  const generate = (request: GenerateRequest, generateOptions: GenerateOptions = {}): Flow<Token> =>
    asFlow(worker.generate(request, generateOptions).pipe(operator));
  return {
    name: worker.name,
    ...(worker.passthrough === true && { passthrough: true }),
    ...(worker.stages !== undefined && { stages: worker.stages }),
    generate,
    infer: (request: GenerateRequest, inferOptions: InferOptions = {}) => complete((onDone) => generate(request, { ...inferOptions, onDone })),
  };
}
