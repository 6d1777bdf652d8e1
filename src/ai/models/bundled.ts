import { dirname } from 'node:path';
import { findUp } from '../../core/package-files.js';

/** The package's `data/` (what the models are generated from), from source or from `dist/`; undefined if missing. */
const corpusText = findUp(import.meta.url, 'data/corpus.txt');
export const BUNDLED_DATA: string | undefined = corpusText === undefined ? undefined : dirname(corpusText);
