// Settings for a process that makes one sandbox and exits (`airlock run`, `airlock diff`): main.ts
// applies them before such a command's modules load. A long-running command never gets them.
import { config } from 'zod';

/**
 * zod compiles a fast parser for each object schema (`new Function`) the first time it parses with
 * it, which pays off over many parses. A one-shot parses each schema about once, and code made by
 * `new Function` is never in the CLI's code cache: it is compiled afresh at every start (issue 31).
 * Without it zod takes its generic path, which checks the same things. Must run before the
 * schemas are made (each decides at construction).
 */
export function tuneForOneShot(): void {
  config({ jitless: true });
}
