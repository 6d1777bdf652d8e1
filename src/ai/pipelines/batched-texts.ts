/**
 * Texts from many concurrent callers run through one model in shared batches: every text asked
 * for goes through one long-lived pipeline, `fromPush` → `infer` (up to `maxBatch` texts per pool
 * run, waiting at most `maxWait` ms for company), and each caller gets its own row back. What
 * `BatchedEmbedder` and `batchedClassifier` are made of.
 */
import { Subject } from 'rxjs';
import { SluiceError } from '../../core/errors.js';
import type { Batch } from '../../../operators/batch.js';
import { fromPush } from '../../flow/push.js';
import type { StageStats } from '../../flow/stats.js';
import { untraced } from '../../flow/sinks.js';
import { infer } from '../stages/infer.js';
import type { PoolingPlan } from '../models/pooling.js';
import type { InferencePool } from '../pool/pool.js';
import type { Feeds, Outputs } from '../pool/options.js';

interface Asked<R> {
  readonly text: string;
  resolve(row: R): void;
  reject(error: unknown): void;
}

/** How the batches are made and what a run's outputs mean. */
export interface BatchedTextsConfig<R> {
  /** Names the pipeline's stages (`<name>`, `<name>-in`) and its errors. */
  readonly name: string;
  readonly model: string | undefined;
  readonly maxBatch: number;
  readonly maxWait: number;
  /** Texts waiting at most; beyond, a text fails with `<CODE>_BUSY`. */
  readonly capacity: number;
  /** The code of its errors (`EMBEDDINGS` → `EMBEDDINGS_BUSY`, `EMBEDDINGS_FAILED`). */
  readonly code: string;
  readonly stats: StageStats;
  readonly pooling?: PoolingPlan;
  readonly toFeeds: (texts: string[]) => Feeds;
  /** One row per text, in order. */
  readonly fromOutputs: (outputs: Outputs, count: number) => readonly R[];
}

/** The shared pipeline; `ask` one text, `close()` ends it. */
export class BatchedTexts<R> {
  private readonly asked = new Subject<Asked<R>>();
  private subscription: { unsubscribe(): void } | undefined;
  private failure: unknown;
  private closed = false;

  constructor(
    private readonly pool: InferencePool,
    private readonly config: BatchedTextsConfig<R>,
  ) {}

  /** Subscribed at the first text, so an inspector attached after construction sees its stages. */
  private start(): void {
    const { pool, config } = this;
    const fail = (batch: Batch<Asked<R>>, error: unknown) => {
      for (const item of batch.items) item.reject(error);
    };
    this.subscription = fromPush(this.asked, {
      name: `${config.name}-in`,
      capacity: config.capacity,
      // Full: the text arriving now is turned away, the ones waiting keep their place.
      policy: 'shed-incoming',
      onShed: ({ value }) =>
        value.reject(new SluiceError(`${config.code}_BUSY`, `more than ${config.capacity} texts are waiting for ${config.name}; retry shortly`)),
    })
      .pipe(
        infer<Asked<R>, { readonly asked: Asked<R>; readonly row: R }>({
          name: config.name,
          pool,
          ...(config.model !== undefined && { model: config.model }),
          maxBatch: config.maxBatch,
          maxWait: config.maxWait,
          ...(config.pooling !== undefined && { pooling: config.pooling }),
          toFeeds: (batch) => config.toFeeds(batch.items.map((a) => a.text)),
          fromOutputs: (outputs, batch) => config.fromOutputs(outputs, batch.items.length).map((row, i) => ({ asked: batch.items[i]!, row })),
          // A failed run fails its own texts, not the pipeline the other callers share.
          errorPolicy: 'skip',
          onFailure: (event) => fail(event.value, event.error),
          stats: config.stats,
        }),
        untraced(),
      )
      .subscribe({
        next: ({ asked, row }) => asked.resolve(row),
        error: (err: unknown) => {
          this.failure = err;
        },
      });
  }

  /** The row of one text, once its batch ran. */
  ask(text: string): Promise<R> {
    if (this.closed) return Promise.reject(new SluiceError(`${this.config.code}_FAILED`, `the ${this.config.name} pipeline is closed`));
    if (this.subscription === undefined) this.start();
    if (this.failure !== undefined)
      return Promise.reject(new SluiceError(`${this.config.code}_FAILED`, `the ${this.config.name} pipeline stopped`, { cause: this.failure }));
    return new Promise<R>((resolve, reject) => this.asked.next({ text, resolve, reject }));
  }

  /** Stops the pipeline; texts still waiting are not run. */
  close(): void {
    this.closed = true;
    this.asked.complete();
    this.subscription?.unsubscribe();
  }
}
