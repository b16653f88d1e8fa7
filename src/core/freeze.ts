// Deep freezing, for values handed out again and again from a cache (a resolved image, the root
// filesystem checked from it): frozen, they cannot change after they were checked.

/** `v` made read-only throughout (plain objects and arrays); returns `v`. */
export function deepFreeze<T>(v: T): T {
  if (v !== null && typeof v === 'object' && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const x of Object.values(v)) deepFreeze(x);
  }
  return v;
}

/** Whether `v` and everything it holds is frozen (a primitive is). */
export function isDeepFrozen(v: unknown): boolean {
  if (v === null || typeof v !== 'object') return true;
  return Object.isFrozen(v) && Object.values(v).every(isDeepFrozen);
}
