/**
 * A test script of marble-tests/support run in a child process (through tsx, from the sources):
 * resolves once it prints "ready"; every other line it prints is kept in `lines`.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));

export interface ChildScript {
  readonly child: ChildProcess;
  readonly lines: string[];
}

export function startScript(script: string, args: readonly string[]): Promise<ChildScript> {
  const child = spawn(process.execPath, ['--conditions=sluice-source', '--import', 'tsx', fileURLToPath(new URL(script, import.meta.url)), ...args], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines: string[] = [];
  return new Promise((resolve, reject) => {
    let buffered = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (chunk: string) => {
      buffered += chunk;
      for (let newline = buffered.indexOf('\n'); newline >= 0; newline = buffered.indexOf('\n')) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line === 'ready') resolve({ child, lines });
        else lines.push(line);
      }
    });
    child.once('exit', (code) => reject(new Error(`${script} exited with ${code} before it was ready`)));
  });
}
