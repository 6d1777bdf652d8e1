/**
 * The layering of src/ (docs/ARCHITECTURE.md), lowest first:
 *   core → flow → operators → resilience, cache → ai → serve → nats;  testing and the entry points on top.
 * A module may import its own layer and the ones below, never one above, and no import may close a
 * cycle. Type-only imports count: a type that runs up a layer is a dependency that runs up a layer.
 */
const layers = ['core', 'flow', 'operators', 'resilience|cache', 'ai', 'serve', 'nats', 'testing'];

const upward = layers.slice(0, -1).map((layer, index) => ({
  name: `${layer.replace('|', '-')}-imports-up`,
  comment: `src/${layer} may not import a layer above it`,
  severity: 'error',
  from: { path: `^src/(${layer})/` },
  to: { path: `^src/(${layers.slice(index + 1).join('|')})/` },
}));

module.exports = {
  forbidden: [
    ...upward,
    {
      name: 'no-entry-imports',
      comment: 'modules import each other, never an entry point (src/index.ts, ai.ts, serve.ts, cli.ts)',
      severity: 'error',
      from: { path: '^src/[^/]+/' },
      to: { path: '^src/(index|ai|serve|nats|cli|peers-ai|peers-serve|peers-nats)\\.ts$' },
    },
    {
      name: 'no-circular',
      comment: 'an import that closes a cycle',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { exportsFields: ['exports'], conditionNames: ['sluice-source', 'import', 'types', 'node', 'default'] },
  },
};
