/** Who a request is: its tenant by bearer token, whether it may call the API, what it may see on the inspector. */
import type { IncomingMessage } from 'node:http';
import { OPERATOR, type InspectViewer } from './inspect/snapshot.js';
import { bearerOf } from './protocol.js';

/** A server's view of its callers, from its API tokens (token → tenant) and its inspect tokens. */
export interface Access {
  /** No tokens: anyone who reaches the server may call it. */
  readonly open: boolean;
  /** The request's tenant; on an open server each peer address counts as one. */
  readonly tenantOf: (req: IncomingMessage) => string | undefined;
  /** The request carries a known API token. */
  readonly authorized: (req: IncomingMessage) => boolean;
  /** A tenant's token reads its own requests on the inspector; an operator's, everyone's; anything else is refused. */
  readonly viewerOf: (req: IncomingMessage) => InspectViewer | undefined;
  /** A WebSocket client's token, as the tenant it names. */
  readonly authenticate: (token: string) => { tenant: string } | undefined;
}

export function accessOf(tokens: Readonly<Record<string, string>>, inspectTokens: readonly string[]): Access {
  const tenants = new Map(Object.entries(tokens));
  const operators = new Set(inspectTokens);
  const open = tenants.size === 0;
  const tokenOf = (req: IncomingMessage) => bearerOf(req.headers.authorization) ?? '';
  return {
    open,
    tenantOf: (req) => (open ? `anonymous-${req.socket.remoteAddress ?? 'unknown'}` : tenants.get(tokenOf(req))),
    authorized: (req) => tenants.has(tokenOf(req)),
    viewerOf: (req) => {
      const token = bearerOf(req.headers.authorization);
      if (token === undefined) return undefined;
      if (operators.has(token)) return OPERATOR;
      const tenant = tenants.get(token);
      return tenant === undefined ? undefined : { role: 'tenant', tenant };
    },
    authenticate: (token) => {
      const tenant = tenants.get(token);
      return tenant === undefined ? undefined : { tenant };
    },
  };
}
