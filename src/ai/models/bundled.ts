import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

/** The package's `data/` (what the models are generated from), from source or from `dist/`; undefined if missing. */
export const BUNDLED_DATA: string | undefined = [new URL('../../../data/', import.meta.url), new URL('../../../../data/', import.meta.url)]
  .map((url) => fileURLToPath(url))
  .find((path) => existsSync(`${path}/corpus.txt`));
