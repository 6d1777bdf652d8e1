/**
 * The layering (docs/ARCHITECTURE.md), lowest first:
 *   core → flow → operators → resilience, cache → ai → serve → nats;  testing and the entry points on top.
 * The operator layer lives at the top of the repository (`operators/`), the others under `src/`.
 * A module may import its own layer and the ones below, never one above, and no import may close a
 * cycle. Type-only imports count: a type that runs up a layer is a dependency that runs up a layer.
 */
const layers = [
  { name: 'core', path: '^src/core/' },
  { name: 'flow', path: '^src/flow/' },
  { name: 'operators', path: '^operators/' },
  { name: 'resilience-cache', path: '^src/(resilience|cache)/' },
  { name: 'ai', path: '^src/ai/' },
  { name: 'serve', path: '^src/serve/' },
  { name: 'nats', path: '^src/nats/' },
  { name: 'testing', path: '^src/testing/' },
];

const upward = layers.slice(0, -1).map((layer, index) => ({
  name: `${layer.name}-imports-up`,
  comment: `${layer.path.slice(1)} may not import a layer above it`,
  severity: 'error',
  from: { path: layer.path },
  to: { path: layers.slice(index + 1).map((above) => `(${above.path})`).join('|') },
}));

/**
 * Inside src/ai, lowest first: models (ONNX graphs, loading, tokenizers, the contracts stages take) → pool
 * (the worker threads that run models) → inference (model workers: local, OpenAI, gateway) → rag (corpus,
 * vector index, embedding cache) → stages (the AI stage operators) → pipelines (workers and embedders
 * composed from stages). The same rule, one level down.
 */
const aiLayers = ['models', 'pool', 'inference', 'rag', 'stages', 'pipelines'];

const aiUpward = aiLayers.slice(0, -1).map((layer, index) => ({
  name: `ai-${layer}-imports-up`,
  comment: `src/ai/${layer} may not import an ai sub-layer above it`,
  severity: 'error',
  from: { path: `^src/ai/(${layer})/` },
  to: { path: `^src/ai/(${aiLayers.slice(index + 1).join('|')})/` },
}));

module.exports = {
  forbidden: [
    ...upward,
    ...aiUpward,
    {
      name: 'ai-folders-known',
      comment: 'every folder of src/ai is one of its sub-layers, so the rules above see it',
      severity: 'error',
      from: { path: `^src/ai/(?!(${aiLayers.join('|')})/)[^/]+/` },
      to: {},
    },
    {
      name: 'no-entry-imports',
      comment: 'modules import each other, never an entry point (src/index.ts, ai.ts, serve.ts, cli.ts)',
      severity: 'error',
      from: { path: '^(src/[^/]+/|operators/)' },
      to: { path: '^src/(index|ai|serve|nats|cli|peers-ai|peers-serve|peers-nats)\\.ts$' },
    },
    {
      name: 'no-circular',
      comment: 'an import that closes a cycle',
      severity: 'error',
      from: { path: '^(src|operators)/' },
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
