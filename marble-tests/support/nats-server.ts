/**
 * A real nats-server (Debian's binary, `.ci/run` installs it) started by a test as a child process:
 * JetStream on, bound to 127.0.0.1, a port the OS picks, its store in a temporary directory that a
 * restart keeps.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before } from 'node:test';
import { connect } from '@nats-io/transport-node';
import type { NatsConnection } from '@nats-io/nats-core';

export interface NatsServer {
  readonly url: string;
  readonly port: number;
  /** Whether it still runs, and if not how it ended and the end of its log: for a test's failure message. */
  state(): string;
  /** Stops the server (SIGTERM, or SIGKILL: a crash) and starts it again on the same port with the same store. */
  restart(signal?: 'SIGTERM' | 'SIGKILL'): Promise<void>;
  /** Stops it; `restart` brings it back. */
  stop(): Promise<void>;
  /** Stops it and removes its store. */
  close(): Promise<void>;
}

const LISTENING = /Listening for client connections on [^:]+:(\d+)/;

/** The last 4 KB each running server wrote after it was ready. */
const tails = new WeakMap<ChildProcess, string>();

/** Whether `child` still runs, else how it ended and the last of its log. */
function stateOf(child: ChildProcess): string {
  if (child.exitCode === null && child.signalCode === null) return `nats-server ${child.pid} running`;
  return `nats-server ${child.pid} exited (code ${child.exitCode}, signal ${child.signalCode}); its last log:\n${tails.get(child) ?? ''}`;
}

/** Starts `nats-server` with `args` and resolves once it is ready, with the client port it listens on. */
export function launchNatsServer(args: readonly string[]): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn('nats-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    let log = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`nats-server did not start within 10 s:\n${log}`));
    }, 10_000);
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`nats-server could not be started (${err.message}); install it: apt-get install nats-server`));
    });
    child.stderr!.setEncoding('utf8');
    child.stderr!.on('data', (chunk: string) => {
      log += chunk;
      const match = LISTENING.exec(log);
      if (match !== null && log.includes('Server is ready')) {
        clearTimeout(timer);
        child.stderr!.removeAllListeners('data');
        // Its last lines stay readable (`tailOf`): why it stopped, if it stops while a test needs it.
        child.stderr!.on('data', (more: string) => tails.set(child, ((tails.get(child) ?? '') + more).slice(-4096)));
        resolve({ child, port: Number(match[1]) });
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`nats-server exited with ${code}:\n${log}`));
    });
  });
}

function launch(port: number, storeDir: string, jetstream: boolean): Promise<{ child: ChildProcess; port: number }> {
  return launchNatsServer([...(jetstream ? ['-js', '-sd', storeDir] : []), '-a', '127.0.0.1', '-p', String(port)]);
}

function stopped(child: ChildProcess, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill(signal);
  });
}

/** `jetstream: false` starts a server without JetStream (to test the error that gives). */
export async function startNatsServer({ jetstream = true } = {}): Promise<NatsServer> {
  const storeDir = mkdtempSync(join(tmpdir(), 'sluice-nats-'));
  let { child, port } = await launch(-1, storeDir, jetstream);
  return {
    url: `nats://127.0.0.1:${port}`,
    port,
    state: () => stateOf(child),
    async restart(signal = 'SIGTERM') {
      await stopped(child, signal);
      ({ child } = await launch(port, storeDir, jetstream));
    },
    async stop() {
      await stopped(child);
    },
    async close() {
      await stopped(child);
      rmSync(storeDir, { recursive: true, force: true });
    },
  };
}

/** A nats-server and a connection to it for the enclosing `describe`: started before its tests, closed after them. */
export function natsServerFixture(): { readonly server: NatsServer; readonly nc: NatsConnection } {
  const fixture = {} as { server: NatsServer; nc: NatsConnection };
  before(async () => {
    fixture.server = await startNatsServer();
    fixture.nc = await connect({ servers: fixture.server.url });
  });
  after(async () => {
    await fixture.nc?.close();
    await fixture.server?.close();
  });
  return fixture;
}
