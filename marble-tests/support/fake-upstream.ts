/**
 * A scripted OpenAI-compatible server on 127.0.0.1, for gateway tests: each chat request
 * takes the next script (or streams a short answer when none is queued) and records what
 * it was sent and what it produced, so a test can ask how many bytes it was made to
 * write after its client had left, or whether it sits blocked on a full socket.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export type Script =
  /** Streams these text pieces, then the finish reason (default `stop`) and a usage chunk. */
  | {
      readonly kind: 'stream';
      readonly pieces?: readonly string[];
      readonly deltas?: readonly Record<string, unknown>[];
      readonly finish?: string;
      readonly everyMs?: number;
    }
  /** Answers this status (a JSON error body unless given one). */
  | { readonly kind: 'status'; readonly status: number; readonly headers?: Readonly<Record<string, string>>; readonly body?: string }
  /** Takes the request and never answers, not even the status line. */
  | { readonly kind: 'stall' }
  /** Streams `after` pieces, then destroys the connection mid-stream. */
  | { readonly kind: 'drop'; readonly after: number }
  /** Streams padded pieces for as long as the connection lives, waiting for `drain` whenever a write is refused. */
  | { readonly kind: 'endless'; readonly pad?: number }
  /**
   * Writes these raw body chunks under an SSE status line, `gapMs` apart (default: all at once), then holds
   * the connection open (or ends the body, with `end`). No chunks and no `end`: silent after the status line.
   */
  | { readonly kind: 'raw'; readonly chunks: readonly (string | Uint8Array)[]; readonly end?: boolean; readonly gapMs?: number };

export interface Served {
  readonly body: Record<string, unknown>;
  readonly headers: IncomingMessage['headers'];
  /** Bytes of body written so far. */
  produced: number;
  /** True while a write was refused and `drain` has not come. */
  blocked: boolean;
  /** True once the connection closed (the client aborted, or the response ended). */
  closed: boolean;
  /** Resolves when the connection closes. */
  readonly whenClosed: Promise<void>;
}

export class FakeUpstream {
  readonly served: Served[] = [];
  private readonly queue: Script[] = [];
  private readonly stalled = new Set<ServerResponse>();
  modelsAsked = 0;
  /** Bodies of the embeddings requests. */
  readonly embedded: Record<string, unknown>[] = [];
  /** Answer embeddings requests with this status, when set. */
  embeddingsStatus: number | undefined;

  private constructor(
    private readonly server: Server,
    readonly models: readonly string[],
  ) {}

  static async start(models: readonly string[] = ['up-model']): Promise<FakeUpstream> {
    let fake: FakeUpstream | undefined;
    const server = createServer((req, res) => fake!.handle(req, res));
    fake = new FakeUpstream(server, models);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return fake;
  }

  /** `http://127.0.0.1:port/v1` */
  get url(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
  }

  /** Queues scripts for the next chat requests, in order. */
  script(...scripts: Script[]): this {
    this.queue.push(...scripts);
    return this;
  }

  /** Drops the scripts not yet played. */
  clear(): this {
    this.queue.length = 0;
    return this;
  }

  /** The last chat request. */
  get last(): Served {
    const last = this.served[this.served.length - 1];
    if (last === undefined) throw new Error('no chat request yet');
    return last;
  }

  async close(): Promise<void> {
    for (const res of this.stalled) res.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    if (req.method === 'GET' && req.url === '/v1/models') {
      this.modelsAsked++;
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify({ object: 'list', data: this.models.map((id) => ({ id, object: 'model', created: 0, owned_by: 'fake' })) }));
    }
    if (req.method === 'POST' && req.url === '/v1/embeddings') return this.embed(req, res);
    if (req.method !== 'POST' || req.url !== '/v1/chat/completions') {
      res.writeHead(404);
      return void res.end();
    }
    const parts: Buffer[] = [];
    req.on('data', (part: Buffer) => parts.push(part));
    req.on('end', () => {
      let closeNow: () => void = () => {};
      const whenClosed = new Promise<void>((resolve) => (closeNow = resolve));
      const served: Served = {
        body: JSON.parse(Buffer.concat(parts).toString('utf8')) as Record<string, unknown>,
        headers: req.headers,
        produced: 0,
        blocked: false,
        closed: false,
        whenClosed,
      };
      this.served.push(served);
      res.on('close', () => {
        served.closed = true;
        this.stalled.delete(res);
        closeNow();
      });
      this.play(this.queue.shift() ?? { kind: 'stream', pieces: ['Hello', ' from', ' upstream'] }, served, res);
    });
  }

  /** One vector `[i, 0.5]` per input. */
  private embed(req: IncomingMessage, res: ServerResponse): void {
    const parts: Buffer[] = [];
    req.on('data', (part: Buffer) => parts.push(part));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as { model: string; input: unknown };
      this.embedded.push(body);
      if (this.embeddingsStatus !== undefined) {
        res.writeHead(this.embeddingsStatus, { 'content-type': 'application/json' });
        return void res.end(JSON.stringify({ error: { message: `scripted ${this.embeddingsStatus}`, type: 'server_error', code: null } }));
      }
      const inputs = Array.isArray(body.input) ? body.input : [body.input];
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          object: 'list',
          data: inputs.map((_, index) => ({ object: 'embedding', index, embedding: [index, 0.5] })),
          model: body.model,
          usage: { prompt_tokens: inputs.length * 3, total_tokens: inputs.length * 3 },
        }),
      );
    });
  }

  private play(script: Script, served: Served, res: ServerResponse): void {
    const model = String(served.body.model);
    const chunk = (delta: Record<string, unknown>, finish: string | null = null, extra: Record<string, unknown> = {}) =>
      `data: ${JSON.stringify({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', created: 0, model, choices: [{ index: 0, delta, finish_reason: finish }], ...extra })}\n\n`;
    const write = (text: string | Uint8Array): boolean => {
      if (served.closed) return false;
      served.produced += Buffer.byteLength(text);
      return res.write(text);
    };
    const head = () => res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    switch (script.kind) {
      case 'status':
        res.writeHead(script.status, { 'content-type': 'application/json', ...script.headers });
        return void res.end(script.body ?? JSON.stringify({ error: { message: `scripted ${script.status}`, type: 'server_error', code: null } }));
      case 'stall':
        this.stalled.add(res);
        return;
      case 'raw': {
        head();
        const finish = () => {
          if (script.end) res.end();
          else this.stalled.add(res);
        };
        if (script.gapMs === undefined) {
          for (const c of script.chunks) write(c);
          return finish();
        }
        let next = 0;
        const step = () => {
          if (served.closed) return;
          if (next >= script.chunks.length) return finish();
          write(script.chunks[next++]!);
          setTimeout(step, script.gapMs);
        };
        return step();
      }
      case 'drop': {
        head();
        for (let i = 0; i < script.after; i++) write(chunk({ content: `piece${i} ` }));
        setTimeout(() => res.destroy(), 20);
        return;
      }
      case 'endless': {
        head();
        const pad = 'x'.repeat(script.pad ?? 512);
        let i = 0;
        const pump = () => {
          while (!served.closed) {
            if (!write(chunk({ content: `${i++}${pad} ` }))) {
              served.blocked = true;
              res.once('drain', () => {
                served.blocked = false;
                pump();
              });
              return;
            }
          }
        };
        return pump();
      }
      case 'stream': {
        head();
        const steps = [
          ...(script.pieces ?? []).map((content) => () => write(chunk({ role: 'assistant', content }))),
          ...(script.deltas ?? []).map((delta) => () => write(chunk(delta))),
          () => write(chunk({}, script.finish ?? 'stop')),
          () =>
            write(
              `data: ${JSON.stringify({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', created: 0, model, choices: [], usage: { prompt_tokens: 7, completion_tokens: (script.pieces?.length ?? 0) + (script.deltas?.length ?? 0), total_tokens: 0 } })}\n\n`,
            ),
          () => {
            write('data: [DONE]\n\n');
            res.end();
          },
        ];
        let next = 0;
        const step = () => {
          if (served.closed || next >= steps.length) return;
          steps[next++]!();
          if (script.everyMs === undefined) step();
          else setTimeout(step, script.everyMs);
        };
        return step();
      }
    }
  }
}
