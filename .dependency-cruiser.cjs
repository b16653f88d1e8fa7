// Import rules for src/ (checked by `npm run lint:deps`, part of `npm run lint`).
// Layers, lowest first; a module may import its own layer and the layers below it, never above:
//   core ← policy ← egress/secrets/guard/images ← backends/mcp ← sandbox ← server ← cli/api/adapters
// (src/index.ts and src/adapters/ai.ts, the package entries: the top), and the FFI library (koffi)
// only from files marked *.privileged.ts. The framework adapters (AI SDK, MCP server, OpenAI) are
// imported only by the CLI and the package entries.
const LAYERS = [
  ['core'],
  ['policy'],
  // images: the OCI image store and executable-allowlist roots (src/core only); the tiers use them.
  ['egress', 'secrets', 'guard', 'images'],
  ['backends', 'mcp'],
  ['sandbox'],
  ['server'],
  ['cli', 'api', 'adapters'],
];

const dirs = (layers) => `^src/(${layers.flat().join('|')})/`;

const layerRules = LAYERS.slice(0, -1).map((own, i) => ({
  name: `layer-${own.join('-')}`,
  comment: `${own.join('/')} may import only ${LAYERS.slice(0, i + 1)
    .flat()
    .join(', ')}`,
  severity: 'error',
  from: { path: dirs([own]) },
  to: { path: `^src/`, pathNot: [dirs(LAYERS.slice(0, i + 1))] },
}));

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'Import cycles (type-only imports included) make the layers meaningless.',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
    ...layerRules,
    {
      name: 'same-layer-peers',
      comment: 'backends and mcp are separate stacks: neither imports the other',
      severity: 'error',
      from: { path: '^src/(backends|mcp)/' },
      to: { path: '^src/(backends|mcp)/', pathNot: ['^src/$1/'] },
    },
    {
      name: 'adapters-leaf',
      comment:
        'Only the CLI and the package entries import the framework adapters; adapters never import the CLI.',
      severity: 'error',
      from: { path: '^src/', pathNot: ['^src/(cli|adapters)/', '^src/index\\.ts$'] },
      to: { path: '^src/adapters/' },
    },
    {
      name: 'adapters-not-cli',
      severity: 'error',
      from: { path: '^src/adapters/' },
      to: { path: '^src/cli/' },
    },
    {
      name: 'koffi-only-privileged',
      comment: 'Only *.privileged.ts files may load the FFI library.',
      severity: 'error',
      from: { path: '^src/', pathNot: '\\.privileged\\.ts$' },
      to: { path: 'node_modules/koffi/' },
    },
    {
      name: 'no-src-to-test',
      severity: 'error',
      from: { path: '^src/' },
      to: { path: '^(test|bench)/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default'],
    },
    exclude: { path: '\\.d\\.ts$' },
  },
};
