/** A worker that ignores `max_tokens`: it generates for as long as it is asked (a custom worker with a bug). */
import { fromIterable } from '../../src/flow/sources.js';
import type { Flow } from '../../src/flow/demand.js';
import type { Token } from '../../src/ai/inference/worker.js';

export class UnrulyWorker {
  readonly name = 'unruly';
  /** Tokens made, over every generation. */
  produced = 0;
  generate(): Flow<Token> {
    const self = this;
    function* endless(): Generator<Token> {
      for (let index = 0; ; index++) {
        self.produced++;
        yield { text: 'x', index };
      }
    }
    return fromIterable(endless());
  }
}
