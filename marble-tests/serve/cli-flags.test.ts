import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { serveOptions, workerOptions } from '../../src/cli.js';
import { type Command, FLAGS, type Flag } from '../../src/cli/flags.js';
import { SERVE_RULES } from '../../src/serve/serve-rules.js';

const BIN = fileURLToPath(new URL('../../bin/sluice.js', import.meta.url));
/** What the flags that need another flag are given beside it. */
const BASE: Readonly<Record<Command, readonly string[]>> = {
  serve: ['--upstream', 'http://127.0.0.1:9/v1#models=m', '--corpus', 'docs'],
  worker: ['--nats', 'nats://127.0.0.1:4222'],
};

function optionsOf(command: Command, argv: readonly string[], env: NodeJS.ProcessEnv): Record<string, unknown> {
  return (command === 'serve' ? serveOptions(argv, env) : workerOptions(argv, env)) as Record<string, unknown>;
}

function at(options: Record<string, unknown>, path: string): unknown {
  return path.split('.').reduce<unknown>((value, key) => (value as Record<string, unknown> | undefined)?.[key], options);
}

/** Values a flag of this type takes, as the option they become. */
function values(flag: Flag): fc.Arbitrary<string | number | boolean | string[]> {
  const word = fc.stringMatching(/^[a-z0-9][a-z0-9._:/]{0,15}$/);
  switch (flag.type) {
    case 'integer':
      return fc.integer({ min: flag.min ?? 0, max: 1_000_000 });
    case 'port':
      return fc.integer({ min: 0, max: 65535 });
    case 'switch':
      return fc.constant(true);
    case 'list':
      return fc.array(word, { minLength: 1, maxLength: 4 });
    case 'string':
      return word;
  }
}

function asFlags(flag: Flag, value: string | number | boolean | string[]): string[] {
  if (flag.type === 'switch') return [`--${flag.name}`];
  if (Array.isArray(value)) return value.map((v) => `--${flag.name}=${v}`);
  return [`--${flag.name}=${value}`];
}

function asEnv(flag: Flag, value: string | number | boolean | string[]): string {
  if (flag.type === 'switch') return '1';
  if (Array.isArray(value)) return value.join(flag.separator === undefined ? ',' : typeof flag.separator === 'string' ? flag.separator : ' ');
  return String(value);
}

/** `argv` without `--name value`, so the flag under test is given only as the test gives it. */
function withoutFlag(argv: readonly string[], name: string): string[] {
  const at = argv.indexOf(`--${name}`);
  return at === -1 ? [...argv] : [...argv.slice(0, at), ...argv.slice(at + 2)];
}

describe('the flag table of the sluice command', () => {
  it('--help lists every flag of the table, with its variable, for each command it belongs to', () => {
    const help = spawnSync(process.execPath, [BIN, 'serve', '--help'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(help.status, 0, help.stderr);
    const [serve, worker] = help.stdout.split('Usage: sluice worker');
    for (const flag of FLAGS) {
      for (const [command, section] of [
        ['serve', serve!],
        ['worker', worker!],
      ] as const) {
        if (flag.help[command] === undefined) continue;
        const named = new RegExp(`^  --${flag.name}${flag.arg === undefined ? '' : ` ${flag.arg.replace(/[[\]]/g, '\\$&')}`} `, 'm');
        assert.match(section, named, `${command} --${flag.name}`);
        for (const variable of flag.env ?? []) assert.ok(section.includes(variable), `${command} --${flag.name}: ${variable}`);
      }
    }
  });

  for (const flag of FLAGS.filter((f) => f.to !== undefined)) {
    const command: Command = flag.help.serve !== undefined ? 'serve' : 'worker';
    it(`--${flag.name} and ${flag.env?.[0]} map alike to ${flag.to}, the flag winning`, () => {
      // Only a flag a rule ties to others is given them; the rest stand alone (--nats excludes --upstream).
      const tied = SERVE_RULES.some((rule) => flag.to === rule.field || flag.to!.startsWith(`${rule.field}.`));
      const base = command === 'worker' ? (flag.name === 'nats' ? [] : BASE.worker) : tied ? withoutFlag(BASE.serve, flag.name) : [];
      fc.assert(
        fc.property(values(flag), values(flag), (value, other) => {
          assert.deepEqual(at(optionsOf(command, [...base, ...asFlags(flag, value)], {}), flag.to!), value);
          assert.deepEqual(at(optionsOf(command, base, { [flag.env![0]!]: asEnv(flag, value) }), flag.to!), value);
          assert.deepEqual(at(optionsOf(command, [...base, ...asFlags(flag, value)], { [flag.env![0]!]: asEnv(flag, other) }), flag.to!), value);
        }),
        { numRuns: 50 },
      );
    });
  }

  it('names the bad flag or variable of a number: exit code 2 and its name', () => {
    for (const flag of FLAGS.filter((f) => f.type === 'integer' || f.type === 'port')) {
      const command: Command = flag.help.serve !== undefined ? 'serve' : 'worker';
      assert.throws(() => optionsOf(command, [...BASE[command], `--${flag.name}=many`], {}), new RegExp(`--${flag.name}: expected a whole number`));
      const variable = flag.env![0]!;
      assert.throws(() => optionsOf(command, BASE[command], { [variable]: 'many' }), new RegExp(`${variable}: expected a whole number`));
    }
  });
});

describe('the rules across serve options', () => {
  /** A value of each field a rule names, as an option and as the flags that set it. */
  const FIELDS: Readonly<Record<string, { readonly option: unknown; readonly flags: readonly string[] }>> = {
    ragModel: { option: 'm', flags: ['--rag-model', 'm'] },
    gateway: { option: { attempts: 2 }, flags: ['--upstream-attempts', '2'] },
    localModels: { option: ['some/dir'], flags: ['--model', 'some/dir'] },
    languageModel: { option: { name: 'lm', generate: () => undefined, infer: () => undefined }, flags: ['--nats', 'nats://127.0.0.1:4222'] },
    upstreams: { option: [{ baseUrl: 'http://127.0.0.1:9/v1', models: ['m'] }], flags: ['--upstream', 'http://127.0.0.1:9/v1#models=m'] },
    corpus: { option: 'docs', flags: ['--corpus', 'docs'] },
    corpusIgnore: { option: ['internals/'], flags: ['--corpus-ignore', 'internals/'] },
    corpusMaxFileBytes: { option: 1024, flags: ['--corpus-max-file-bytes', '1024'] },
  };
  /** Each way of breaking each rule: the fields set. */
  const breaking = SERVE_RULES.flatMap((rule) => [
    ...(rule.needs ?? []).map((missing) => ({ rule, set: [rule.field, ...rule.needs!.filter((f) => f !== missing)] })),
    ...(rule.excludes === undefined ? [] : [{ rule, set: [rule.field, rule.excludes] }]),
  ]);

  it('are checked by the server at construction, at the field of the rule', async () => {
    const { startServer } = await import('../../src/serve/app.js');
    const { InvalidOptionsError } = await import('../../src/core/errors.js');
    for (const { rule, set } of breaking) {
      const options = Object.fromEntries(set.map((field) => [field, FIELDS[field]!.option]));
      await assert.rejects(
        startServer({ port: 0, ...options }).then((running) => running.shutdown()),
        (err: unknown) => err instanceof InvalidOptionsError && err.issues.some((issue) => issue.path === rule.field && issue.message.includes(rule.why)),
        `${set.join(' + ')}`,
      );
    }
  });

  it('are checked by the command on its flags, naming them', () => {
    for (const { rule, set } of breaking) {
      const argv = set.flatMap((field) => FIELDS[field]!.flags);
      assert.throws(
        () => serveOptions(argv, {}),
        (err: unknown) => err instanceof Error && err.message.includes(FIELDS[rule.field]!.flags[0]!) && err.message.includes(rule.why),
        argv.join(' '),
      );
    }
  });
});
