/**
 * Question sets of `npm run eval`: a corpus (the bundled one, a folder, Markdown files shipped
 * inside installed npm packages or with Node.js itself, copied into a temporary folder, or a folder
 * of the npm CLI that runs the eval) and its questions, each with the
 * file that states the answer and a pattern the answer's fact matches, or none when the corpus
 * does not cover it.
 */
import { existsSync } from 'node:fs';
import { access, copyFile, mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import * as z from 'zod';

/** A question whose answer one file states (`file`, `fact`), or one the corpus does not cover (neither). */
export interface Question {
  readonly question: string;
  /** The corpus file (path relative to the corpus) that states the answer; absent when uncovered. */
  readonly file?: string;
  /** A regular expression (case-insensitive) the answer's key fact matches; absent when uncovered. */
  readonly fact?: string;
}

/** Where a set's documents come from. */
export type CorpusSpec =
  /** A folder, relative to the repository root, or absolute (a set over it is skipped where it is missing). */
  | { readonly dir: string }
  /** Files under `node_modules/`, copied at these same relative paths into a temporary corpus. */
  | { readonly npm: readonly string[] }
  /** A folder of the npm CLI package that runs the eval (`docs/content`: npm's own documentation, installed with Node). */
  | { readonly npmCli: string }
  /** Files of the Node.js API documentation installed beside the `node` that runs the eval (`nodeDocsRoot`), copied like `npm`'s. */
  | { readonly nodeDocs: readonly string[] }
  /** A folder of the Node.js documentation installed beside the `node` that runs the eval (`contributing`: Node's contributor guides), read as it is. */
  | { readonly nodeDocsFolder: string };

export interface QuestionSet {
  readonly name: string;
  readonly description?: string;
  readonly corpus: CorpusSpec;
  readonly questions: readonly Question[];
}

const questionSchema = z
  .strictObject({ question: z.string().min(1), file: z.string().min(1).optional(), fact: z.string().min(1).optional() })
  .refine((q) => (q.file === undefined) === (q.fact === undefined), { error: 'a covered question has both file and fact; an uncovered one neither' })
  .refine((q) => q.fact === undefined || isRegExp(q.fact), { error: 'fact must be a valid regular expression' });

const setSchema = z.strictObject({
  name: z.string().min(1),
  description: z.string().optional(),
  corpus: z.union([
    z.strictObject({ dir: z.string().min(1) }),
    z.strictObject({ npm: z.array(z.string().min(1)).min(1) }),
    z.strictObject({ npmCli: z.string().min(1) }),
    z.strictObject({ nodeDocs: z.array(z.string().min(1)).min(1) }),
    z.strictObject({ nodeDocsFolder: z.string().min(1) }),
  ]),
  questions: z.array(questionSchema).min(1),
});

function isRegExp(source: string): boolean {
  try {
    new RegExp(source, 'i');
    return true;
  } catch {
    return false;
  }
}

/** Reads and checks a question set (JSON); a bad one fails naming the file and the path of the bad field. */
export async function readQuestionSet(path: string): Promise<QuestionSet> {
  const parsed = setSchema.safeParse(JSON.parse(await readFile(path, 'utf8')));
  if (!parsed.success) {
    const issues = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(root)'}: ${issue.message}`).join('; ');
    throw new Error(`question set ${path}: ${issues}`);
  }
  const set = parsed.data;
  const corpus: CorpusSpec = set.corpus;
  const copied = 'npm' in corpus ? { key: 'npm', files: corpus.npm } : 'nodeDocs' in corpus ? { key: 'nodeDocs', files: corpus.nodeDocs } : undefined;
  if (copied !== undefined) {
    const listed = new Set(copied.files);
    const stray = set.questions.findIndex((q) => q.file !== undefined && !listed.has(q.file));
    if (stray >= 0) throw new Error(`question set ${path}: questions.${stray}.file: ${set.questions[stray]!.file} is not in corpus.${copied.key}`);
  }
  return { ...set, corpus, questions: set.questions.map((q) => ({ ...q })) };
}

/** A set's corpus on disk, and the questions it can ask there. */
export interface AssembledCorpus {
  readonly dir: string;
  /** Questions whose file is present, and every uncovered one. */
  readonly questions: readonly Question[];
  /** Source files not found, with the questions left out because of them. */
  readonly missing: readonly string[];
  readonly skippedQuestions: number;
  /** Removes the temporary folder, if one was made. */
  remove(): Promise<void>;
}

/**
 * The set's corpus: its folder as it is, or the listed `node_modules` (or Node.js docs) files copied
 * into a temporary folder (nothing is downloaded). A missing file is reported and its questions left
 * out; with no file at all the corpus is `undefined`.
 */
export async function assembleCorpus(set: QuestionSet, root: string): Promise<AssembledCorpus | undefined> {
  if ('dir' in set.corpus) {
    const dir = isAbsolute(set.corpus.dir) ? set.corpus.dir : resolve(root, set.corpus.dir);
    // A folder installed on some machines only (`/usr/share/cmake-3.25/Help`) skips the set where it is missing.
    if (isAbsolute(set.corpus.dir) && !existsSync(dir)) return undefined;
    return { dir, questions: set.questions, missing: [], skippedQuestions: 0, remove: async () => {} };
  }
  if ('npmCli' in set.corpus) return folderCorpus(set, join(npmCliRoot(), set.corpus.npmCli));
  if ('nodeDocsFolder' in set.corpus) return folderCorpus(set, join(nodeDocsRoot(), '..', set.corpus.nodeDocsFolder));
  if ('nodeDocs' in set.corpus) return copiedCorpus(set, nodeDocsRoot(), set.corpus.nodeDocs);
  return copiedCorpus(set, join(root, 'node_modules'), set.corpus.npm);
}

/** The Node.js API documentation installed beside the running `node` (`<prefix>/share/doc/nodejs/api`, as Debian's and NodeSource's packages install it). */
export function nodeDocsRoot(execPath: string = process.execPath): string {
  return resolve(dirname(execPath), '..', 'share', 'doc', 'nodejs', 'api');
}

/** `files` of the folder `base` copied into a temporary corpus at the same relative paths. */
async function copiedCorpus(set: QuestionSet, base: string, files: readonly string[]): Promise<AssembledCorpus | undefined> {
  const dir = await mkdtemp(join(tmpdir(), `sluice-eval-${set.name}-`));
  const missing: string[] = [];
  for (const file of files) {
    const from = join(base, file);
    try {
      await access(from);
    } catch {
      missing.push(file);
      continue;
    }
    await mkdir(dirname(join(dir, file)), { recursive: true });
    await copyFile(from, join(dir, file));
  }
  const remove = () => rm(dir, { recursive: true, force: true });
  if (missing.length === files.length) {
    await remove();
    return undefined;
  }
  const absent = new Set(missing);
  const questions = set.questions.filter((q) => q.file === undefined || !absent.has(q.file));
  return { dir, questions, missing, skippedQuestions: set.questions.length - questions.length, remove };
}

/** The npm CLI package running this process (`npm run eval` sets `npm_execpath`), else the one installed beside `node`. */
export function npmCliRoot(env: NodeJS.ProcessEnv = process.env): string {
  const execPath = env.npm_execpath;
  if (execPath !== undefined && /npm-cli\.js$/.test(execPath)) return resolve(dirname(execPath), '..');
  return resolve(dirname(process.execPath), '..', 'lib', 'node_modules', 'npm');
}

/** An installed folder as the corpus (npm's or Node's docs); questions whose file this version lacks are left out, and a missing folder skips the set. */
async function folderCorpus(set: QuestionSet, dir: string): Promise<AssembledCorpus | undefined> {
  if (!existsSync(dir)) return undefined;
  const files = [...new Set(set.questions.flatMap((q) => (q.file === undefined ? [] : [q.file])))];
  const missing: string[] = [];
  for (const file of files) if (!existsSync(join(dir, file))) missing.push(file);
  const absent = new Set(missing);
  const questions = set.questions.filter((q) => q.file === undefined || !absent.has(q.file));
  return { dir, questions, missing, skippedQuestions: set.questions.length - questions.length, remove: async () => {} };
}
