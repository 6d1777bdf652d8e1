/** A worker that ignores `max_tokens`: it says `x` for as long as it is asked (a custom worker with a bug). Its `steps` count the tokens made. */
import { ScriptedWorker } from 'sluice/testing/ai';

export const unrulyWorker = (): ScriptedWorker => new ScriptedWorker({ name: 'unruly', tokens: { repeat: 'x' }, honourMaxTokens: false });
