/**
 * The `sluice` command in a child process, as a user runs it (`bin/sluice.js <command> ...`): what it
 * printed, for waiting on a line and for failure messages; stopped by SIGTERM as a user would.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../..', import.meta.url));
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export class CliProcess {
  stdout = '';
  stderr = '';
  private readonly exited: Promise<number | null>;

  private constructor(
    readonly command: string,
    readonly child: ChildProcess,
  ) {
    child.stdout!.setEncoding('utf8').on('data', (chunk: string) => (this.stdout += chunk));
    child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (this.stderr += chunk));
    this.exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));
  }

  static start(command: 'serve' | 'worker', args: readonly string[], env: NodeJS.ProcessEnv = process.env): CliProcess {
    return new CliProcess(command, spawn(process.execPath, ['bin/sluice.js', command, ...args], { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] }));
  }

  /** Resolves with the first match of `pattern` in stdout; rejects if the process exits first or `timeout` passes. */
  async waitFor(pattern: RegExp, timeout = 120_000): Promise<RegExpExecArray> {
    const deadline = Date.now() + timeout;
    while (Date.now() < deadline) {
      const match = pattern.exec(this.stdout);
      if (match) return match;
      if (this.child.exitCode !== null) throw new Error(`sluice ${this.command} exited with ${this.child.exitCode}:\n${this.output()}`);
      await sleep(50);
    }
    throw new Error(`sluice ${this.command} did not print ${pattern} within ${timeout} ms:\n${this.output()}`);
  }

  /** The URL `sluice serve` prints once it listens. */
  async url(timeout = 120_000): Promise<string> {
    return (await this.waitFor(/^sluice \S+ listening on (http:\/\/\S+)\n/, timeout))[1]!;
  }

  /** Sends SIGTERM; resolves with the exit code. */
  async stop(timeout = 60_000): Promise<number | null> {
    if (this.child.exitCode !== null) return this.child.exitCode;
    this.child.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const code = await Promise.race([this.exited, new Promise<'timeout'>((resolve) => (timer = setTimeout(resolve, timeout, 'timeout')))]);
    clearTimeout(timer);
    if (code === 'timeout') {
      this.child.kill('SIGKILL');
      throw new Error(`sluice ${this.command} did not exit within ${timeout} ms of SIGTERM:\n${this.output()}`);
    }
    return code;
  }

  /** Resolves with the exit code once the process ends on its own. */
  exit(): Promise<number | null> {
    return this.exited;
  }

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }

  output(): string {
    return `--- stdout\n${this.stdout}--- stderr\n${this.stderr}`;
  }
}
