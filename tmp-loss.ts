import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { chunkMarkdown } from './src/ai/rag/markdown-chunks.js';
import { quotablesOf } from './src/ai/rag/sentences.js';
const files: string[] = [];
for (const f of readdirSync('eval/sets')) {
  const set = JSON.parse(readFileSync(join('eval/sets', f), 'utf8'));
  if (set.corpus.npm) for (const p of set.corpus.npm) files.push(join('node_modules', p));
}
const walk = (d: string): string[] => readdirSync(d, { withFileTypes: true }).flatMap((e) => e.isDirectory() ? walk(join(d, e.name)) : /\.mdx?$/.test(e.name) ? [join(d, e.name)] : []);
files.push(...walk('/usr/lib/node_modules/npm/docs/content'));
let total = 0, empty = 0; const samples: string[] = [];
const words = (t: string) => (t.match(/[A-Za-z]{2,}/g) ?? []).length;
let lostWords = 0, allWords = 0;
for (const f of files) {
  let text: string; try { text = readFileSync(f, 'utf8'); } catch { continue; }
  for (const p of chunkMarkdown(text, f)) {
    total++;
    const q = quotablesOf(p.text);
    const w = words(p.text), wq = q.reduce((n, x) => n + words(x.text), 0);
    allWords += w; if (wq < w * 0.5) lostWords += w - wq;
    if (q.length === 0 && w >= 3) { empty++; if (samples.length < 400) samples.push(`${f.replace(/^.*node_modules\//, '')} | ${p.text.replace(/\n/g, '⏎').slice(0, 160)}`); }
  }
}
console.log({ total, empty, allWords, lostWords });
console.log(samples.join('\n'));
