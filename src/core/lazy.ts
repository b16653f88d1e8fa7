// Packages that only some features use, loaded on first use: `import 'airlock'` and a one-shot
// `airlock run` without a network policy never load them (they cost tens of milliseconds to hundreds
// of milliseconds each at startup). Only CommonJS packages: they load synchronously, so the code that
// uses them stays synchronous.
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/** `id`'s module.exports, required the first time the returned function is called. */
export function lazyRequire<T>(id: string): () => T {
  let loaded: T | undefined;
  return () => (loaded ??= require(id) as T);
}
