/** A worker that ignores `max_tokens`: it says `x` for as long as it is asked (a custom worker with a bug). */
import { ScriptedWorker } from 'sluice/testing';

function* endless(): Generator<string> {
  for (;;) yield 'x';
}

/** Its `steps` count the tokens made, over every generation. */
export const unrulyWorker = (): ScriptedWorker => new ScriptedWorker({ name: 'unruly', tokens: () => endless(), honourMaxTokens: false });
