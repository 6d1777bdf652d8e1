/**
 * A JetStream cluster of real nats-server processes started by a test: each node a child process
 * bound to 127.0.0.1, with its own store in a temporary directory, routes to the others, and a
 * name (`n1`, `n2`...). Resolves once the cluster has elected its metadata leader.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface ClusterNode {
  readonly name: string;
  readonly url: string;
  /** Whether its process is running. */
  readonly running: boolean;
  /** Stops its process with `signal` (SIGKILL: a crash) and waits for it to exit. */
  kill(signal?: 'SIGTERM' | 'SIGKILL'): Promise<void>;
}

export interface NatsCluster {
  readonly nodes: readonly ClusterNode[];
  /** Every node's URL, comma-separated (what `--nats` and `connect({ servers })` take). */
  readonly urls: string;
  /** Stops every node and removes the stores. */
  close(): Promise<void>;
}

/** A port the OS has free now (closed again at once: the node binds it next). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => (typeof address === 'object' && address !== null ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

const LEADER = /JetStream cluster new metadata leader|Self is new JetStream cluster metadata leader/;

export async function startNatsCluster(size = 3): Promise<NatsCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-nats-cluster-'));
  const ports = await Promise.all(Array.from({ length: size }, freePort));
  const routePorts = await Promise.all(Array.from({ length: size }, freePort));
  const routes = routePorts.map((port) => `nats-route://127.0.0.1:${port}`).join(', ');
  const children: ChildProcess[] = [];
  const started = Array.from({ length: size }, (_, i) => {
    const name = `n${i + 1}`;
    const config = join(dir, `${name}.conf`);
    writeFileSync(
      config,
      [
        `server_name: ${name}`,
        `listen: 127.0.0.1:${ports[i]}`,
        `jetstream { store_dir: "${join(dir, name)}" }`,
        `cluster { name: sluice, listen: 127.0.0.1:${routePorts[i]}, routes: [${routes}] }`,
      ].join('\n'),
    );
    const child = spawn('nats-server', ['-c', config], { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(child);
    return new Promise<void>((resolve, reject) => {
      let log = '';
      const timer = setTimeout(() => reject(new Error(`${name} elected no metadata leader within 20 s:\n${log}`)), 20_000);
      child.once('error', (error) => reject(new Error(`nats-server could not be started (${error.message})`)));
      child.stderr!.setEncoding('utf8');
      child.stderr!.on('data', (chunk: string) => {
        log += chunk;
        if (LEADER.test(log)) {
          clearTimeout(timer);
          child.stderr!.removeAllListeners('data');
          child.stderr!.resume();
          resolve();
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`${name} exited with ${code}:\n${log}`));
      });
    });
  });
  const stop = (child: ChildProcess, signal: 'SIGTERM' | 'SIGKILL'): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
    return new Promise((resolve) => {
      child.once('exit', () => resolve());
      child.kill(signal);
    });
  };
  const close = async () => {
    await Promise.all(children.map((child) => stop(child, 'SIGTERM')));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await Promise.all(started);
  } catch (error) {
    await close();
    throw error;
  }
  const nodes = children.map((child, i) => ({
    name: `n${i + 1}`,
    url: `nats://127.0.0.1:${ports[i]}`,
    get running() {
      return child.exitCode === null && child.signalCode === null;
    },
    kill: (signal: 'SIGTERM' | 'SIGKILL' = 'SIGKILL') => stop(child, signal),
  }));
  return { nodes, urls: nodes.map((node) => node.url).join(','), close };
}
