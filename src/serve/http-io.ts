/** Small `node:http` helpers: JSON answers, OpenAI-style errors, a bounded body reader and its JSON. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError } from './openai-wire.js';

export function sendError(res: ServerResponse, error: ApiError): void {
  if (res.headersSent || res.destroyed) return;
  // A body still arriving is not read: closing the connection is cheaper than draining it.
  if (error.status === 413) res.setHeader('connection', 'close');
  res.writeHead(error.status, { ...error.headers, 'content-type': 'application/json' });
  res.end(error.body());
}

export function sendJson(res: ServerResponse, status: number, value: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(value));
}

export function headerValue(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

/** A body's JSON (400 when it is not). */
export function parseJson(bytes: Buffer): unknown {
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch {
    throw new ApiError(400, 'The request body is not valid JSON.', 'invalid_request_error', 'invalid_json');
  }
}

/** Reads the body up to `limit` bytes (413 beyond), unparsed. */
export function readBytes(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) {
    return Promise.reject(new ApiError(413, `The request body is larger than ${limit} bytes.`, 'invalid_request_error', 'request_too_large'));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.off('data', onData);
        reject(new ApiError(413, `The request body is larger than ${limit} bytes.`, 'invalid_request_error', 'request_too_large'));
        return;
      }
      chunks.push(chunk);
    };
    req.on('data', onData);
    req.once('error', reject);
    req.once('end', () => {
      if (size <= limit) resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
    });
  });
}
