// The isolation tiers by name. Apart from spec.ts (which validates them with zod) so that the CLI can
// list them in its --help without loading zod.
/** The isolation tier names a spec may ask for (`backend`). */
export const BACKEND_NAMES = ['namespaces', 'gvisor', 'microvm', 'wasm'] as const;
/** One of `BACKEND_NAMES`. */
export type BackendName = (typeof BACKEND_NAMES)[number];
