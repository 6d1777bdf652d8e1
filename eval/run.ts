/**
 * `npm run eval`: how well `sluice-rag` answers, beside a plain BM25 search, on question sets
 * with known answers. A measurement: it exits 0 whatever the figures, unless `--check` is given
 * and a goal is missed.
 *
 *     npm run eval                      # every set in eval/sets/
 *     npm run eval -- --set bundled     # one set (by file name without .json), repeatable
 *     npm run eval -- --misses          # also list each question answered wrong
 *     npm run eval -- --json out.json   # also write the figures and every answer
 *     npm run eval -- --check           # exit 1 when a goal of issue 37 is missed
 *
 * The tables go to stdout, progress to stderr. Models are generated into `models/` when missing.
 */
import { readdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { evaluateSet, poolReports, type CorpusReport } from './harness.js';
import { readQuestionSet } from './question-set.js';
import { formatGuard, formatMisses, formatReport, missedGoals, missedGuard } from './report.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const { values } = parseArgs({
  options: {
    set: { type: 'string', multiple: true },
    sets: { type: 'string', default: join(root, 'eval', 'sets') },
    models: { type: 'string', default: join(root, 'models') },
    misses: { type: 'boolean', default: false },
    json: { type: 'string' },
    check: { type: 'boolean', default: false },
  },
});

const files = (await readdir(values.sets))
  .filter((f) => f.endsWith('.json'))
  .sort()
  .filter((f) => values.set === undefined || values.set.includes(f.slice(0, -'.json'.length)));
if (files.length === 0) {
  console.error(`no question set${values.set === undefined ? '' : ` named ${values.set.join(', ')}`} in ${values.sets}`);
  process.exit(2);
}

const reports: CorpusReport[] = [];
for (const file of files) {
  const set = await readQuestionSet(join(values.sets, file));
  console.error(`${set.name}: ${set.questions.length} questions…`);
  const report = await evaluateSet(set, { root, models: values.models, log: (line) => console.error(line) });
  if (report === undefined) continue;
  reports.push(report);
  console.log(`\n${formatReport(report)}`);
  if (values.misses) console.log(`\n${formatMisses(report)}`);
}

// Every set together: the run's figures at a glance, and the guard's false alarms over every question asked.
const all = reports.length > 1 ? poolReports(reports) : reports[0];
if (all !== undefined) {
  if (reports.length > 1) console.log(`\n${formatReport(all)}`);
  console.log(`\n${formatGuard(all)}`);
}

if (values.json !== undefined) await writeFile(values.json, `${JSON.stringify({ at: new Date().toISOString(), reports }, null, 2)}\n`);
const missed = [...reports.flatMap(missedGoals), ...(all === undefined ? [] : [missedGuard(all)].filter((m) => m !== undefined))];
if (values.check) {
  for (const line of missed) console.log(`MISS ${line}`);
  if (missed.length > 0 || reports.length === 0) process.exitCode = 1;
  else console.log('\nevery goal met');
}
