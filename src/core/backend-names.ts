// The isolation tiers by name. Apart from spec.ts (which validates them with zod) so that the CLI can
// list them in its --help without loading zod.
export const BACKEND_NAMES = ['namespaces', 'gvisor', 'microvm'] as const;
export type BackendName = (typeof BACKEND_NAMES)[number];
