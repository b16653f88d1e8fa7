// Worker threads run real module files that sit next to the module that starts them, so the
// typechecker sees their code and the built package ships them as plain .js files. When Airlock runs
// from its TypeScript source (the tests, `tsx`), the worker loads the .ts file through tsx's loader.
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import { Worker, type WorkerOptions } from 'node:worker_threads';

/**
 * Starts `name` (a path relative to `callerUrl` without its extension, e.g.
 * './launcher-worker.privileged') as a worker thread. `callerUrl` is the caller's `import.meta.url`.
 */
export function moduleWorker(callerUrl: string, name: string, options: WorkerOptions = {}): Worker {
  // A worker inherits the process's execArgv; `--input-type` (node --input-type=module -e …) is
  // refused for a worker that loads a file, so it is left out.
  options = {
    execArgv: process.execArgv.filter((a) => !a.startsWith('--input-type')),
    ...options,
  };
  const fromSource = callerUrl.endsWith('.ts');
  const target = new URL(`${name}${fromSource ? '.ts' : '.js'}`, callerUrl);
  if (!fromSource) return new Worker(target, options);
  // tsx's ESM API registers its loader in this worker before the module is imported.
  const api = createRequire(callerUrl)
    .resolve('tsx/esm/api')
    .replace(/\.cjs$/, '.mjs');
  const boot =
    `import(${JSON.stringify(pathToFileURL(api).href)})` +
    `.then((m) => { m.register(); return import(${JSON.stringify(target.href)}); })`;
  return new Worker(boot, { ...options, eval: true });
}
