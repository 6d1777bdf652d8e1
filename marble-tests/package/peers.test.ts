/**
 * One declared list of optional peers (src/core/peer-list.ts): the README's install table, the
 * package's peerDependencies and every peer loader in src/core/peers.ts must agree with it. The
 * consumer test (consumer.test.ts) installs what the README says and runs the command for real.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { MissingPeerError } from '../../src/core/errors.js';
import { INSTALL_SPECS, OPTIONAL_EXTRAS, PEER_NEEDS, type PeerName, installCommand, namedUsers, peersOf } from '../../src/core/peer-list.js';
import { requirePeers } from '../../src/core/peers.js';
import { packageOfSpec, readmeInstallRows, readmePeersOf } from '../support/readme-peers.js';

const root = new URL('../../', import.meta.url);
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8')) as {
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
};
const declared = Object.keys(INSTALL_SPECS) as PeerName[];

describe('the optional peers, declared once', () => {
  it("the README's install table has one row per declared need, with its base and exactly its packages", () => {
    const rows = readmeInstallRows();
    assert.deepEqual(
      rows.map((r) => r.user),
      PEER_NEEDS.map((n) => n.user),
      'the rows of the install table and the declared needs differ',
    );
    for (const need of PEER_NEEDS) {
      const row = rows.find((r) => r.user === need.user)!;
      assert.equal(row.base, 'base' in need ? need.base : undefined, `README row "${need.user}": the row it builds on`);
      assert.deepEqual(row.packages, need.packages, `README row "${need.user}": its packages`);
      assert.deepEqual(
        row.specs,
        need.packages.map((name) => INSTALL_SPECS[name]),
        `README row "${need.user}": what it tells to install`,
      );
      assert.deepEqual(readmePeersOf(need.user, rows), peersOf(need.user), `README row "${need.user}": everything it installs`);
    }
  });

  it('every declared peer is an optional peer dependency, with the range its install command names', () => {
    for (const name of declared) {
      assert.ok(name in pkg.peerDependencies, `${name} is not in peerDependencies`);
      assert.equal(pkg.peerDependenciesMeta[name]?.optional, true, `${name} is not optional in peerDependenciesMeta`);
      const spec = INSTALL_SPECS[name];
      assert.equal(packageOfSpec(spec), name);
      if (spec !== name) assert.equal(spec.slice(name.length + 1), pkg.peerDependencies[name], `${name}: install range and peer range differ`);
    }
    const optional = Object.keys(pkg.peerDependencies).filter((name) => pkg.peerDependenciesMeta[name]?.optional === true);
    assert.deepEqual(optional.sort(), [...declared].sort(), 'an optional peer dependency that the list does not declare');
  });

  it('every peer a loader in src/core/peers.ts loads is needed by an entry point or command, or declared optional with its fallback', () => {
    const source = readFileSync(new URL('src/core/peers.ts', root), 'utf8');
    const loaded = new Set([...source.matchAll(/\bpeer(?:<[^(]*>)?\(\s*'([^']+)'/gs)].map((m) => m[1]!));
    assert.ok(loaded.size >= 10, `found only ${[...loaded].join(', ')}: the pattern no longer matches the loaders`);
    const needed = new Set(PEER_NEEDS.flatMap((n) => n.packages as readonly string[]));
    for (const name of loaded) assert.ok(needed.has(name) || name in OPTIONAL_EXTRAS, `${name} is loaded by src/core/peers.ts but no need declares it`);
  });

  it('a need names each missing package once, with one install command for all of them', () => {
    const error = new MissingPeerError(['hdr-histogram-js', 'pino', '@nats-io/jetstream'], 'sluice serve');
    assert.equal(error.code, 'MISSING_PEER');
    assert.deepEqual(error.packageNames, ['hdr-histogram-js', 'pino', '@nats-io/jetstream']);
    assert.equal(error.packageName, 'hdr-histogram-js');
    assert.match(error.message, /^sluice serve needs the packages "hdr-histogram-js", "pino", "@nats-io\/jetstream", which are not installed\./);
    assert.ok(error.message.endsWith('npm install hdr-histogram-js pino @nats-io/jetstream@~3.3.1'), error.message);
    assert.equal(installCommand(['ws']), 'npm install ws');
  });

  it('a command run with a flag is named once, by the flag that needs the most', () => {
    assert.equal(namedUsers(['sluice serve', 'sluice serve --model <dir>']), 'sluice serve --model <dir>');
    assert.equal(
      namedUsers(['sluice serve', 'sluice serve --model <dir>', 'sluice serve --nats <url>']),
      'sluice serve --model <dir> and sluice serve --nats <url>',
    );
    assert.equal(namedUsers(['sluice serve']), 'sluice serve');
    assert.equal(namedUsers(['sluice/serve', 'sluice serve']), 'sluice serve');
  });

  it('with every peer installed (this repository), every need passes its check', () => {
    for (const need of PEER_NEEDS) requirePeers(need.user);
  });
});
