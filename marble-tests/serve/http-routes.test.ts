import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseOptions } from '../../src/flow/options.js';
import { createHttpHandler, type HttpHandlerOptions } from '../../src/serve/http.js';
import { optionsSchema } from '../../src/serve/http-options.js';
import { HttpEdge } from '../../src/serve/http/edge.js';
import { allowOf } from '../../src/serve/http/route.js';
import { routeTable } from '../../src/serve/http/routes.js';
import type { ChatWorker } from '../../src/serve/openai-wire.js';

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'] as const;

describe('the HTTP route table', () => {
  const worker = {
    name: 'm',
    generate: () => {
      throw new Error('no route reaches a model here');
    },
  } as unknown as ChatWorker;
  const options: HttpHandlerOptions = { worker, auth: () => true };
  let server: Server;
  let base: string;

  before(async () => {
    server = createServer(createHttpHandler(options));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it('answers every route of the table with 405 and its Allow header for each method it does not take', async () => {
    const routes = routeTable(new HttpEdge(parseOptions(optionsSchema(), options, 'HTTP handler options')));
    assert.ok(routes.length >= 9);
    for (const route of routes) {
      const path = route.path.replace('{id}', 'm');
      const allow = allowOf(route);
      for (const method of METHODS.filter((m) => !allow.split(', ').includes(m))) {
        const response = await fetch(`${base}${path}`, { method });
        assert.equal(response.status, 405, `${method} ${path}`);
        assert.equal(response.headers.get('allow'), allow, `${method} ${path}`);
        if (method === 'HEAD') continue;
        const { error } = (await response.json()) as { error: { code: string; type: string } };
        assert.deepEqual([error.code, error.type], ['method_not_allowed', 'invalid_request_error'], `${method} ${path}`);
      }
    }
  });

  it('keeps one declaration per method and path', () => {
    const routes = routeTable(new HttpEdge(parseOptions(optionsSchema(), options, 'HTTP handler options')));
    const keys = routes.map((r) => `${r.method} ${r.path}`);
    assert.equal(new Set(keys).size, keys.length);
  });
});
