// Writes the bundled ONNX models into models/ (git-ignored), from code and data/ alone: no downloads.
// Usage: node --conditions=sluice-source --import tsx scripts/generate-models.ts [--force] [--out DIR]
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { generateModels } from '../src/ai/models/generate.js';

const root = fileURLToPath(new URL('../', import.meta.url));
const { values } = parseArgs({ options: { force: { type: 'boolean', default: false }, out: { type: 'string', default: `${root}models` } } });

await generateModels({ outDir: values.out, dataDir: `${root}data`, force: values.force, verify: true, log: (line) => console.log(line) });
