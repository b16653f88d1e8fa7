// The JavaScript/TypeScript names the rules know (after alias resolution in javascript.ts). Pure data.

/** `node:child_process` → `child_process`, `fs/promises` → `fs.promises`, `globalThis.eval` → `eval`. */
export function normaliseJs(q: string): string {
  let s = q
    .replace(/^node:/, '')
    .replace(/^fs\/promises/, 'fs.promises')
    .replace(/^fs-extra/, 'fs');
  s = s.replace(/^(?:globalThis|global|window|self)\./, '');
  s = s.replace(/^(?:require\('fs'\)|fs)\.promises\./, 'fs.promises.');
  return s;
}

/** Calls that execute a string as JavaScript. */
export const JS_EXEC = new Set([
  'eval',
  'Function',
  'vm.runInThisContext',
  'vm.runInNewContext',
  'vm.runInContext',
  'vm.Script',
  'vm.compileFunction',
  'vm.SourceTextModule',
  'setTimeout',
  'setInterval',
  'setImmediate',
]);

/** Calls that run their first argument through a shell. */
export const JS_SHELL_STRING = new Set([
  'child_process.exec',
  'child_process.execSync',
  'shelljs.exec',
  'execa.command',
  'execa.commandSync',
  'execaCommand',
  'execaCommandSync',
]);

/** Calls that start a program from (file, args[, options]). */
export const JS_SUBPROCESS = new Set([
  'child_process.spawn',
  'child_process.spawnSync',
  'child_process.execFile',
  'child_process.execFileSync',
  'execa',
  'execa.sync',
  'execa.execa',
  'execa.execaSync',
]);

/** Calls whose result is decoded from an encoding that hides text. */
export const JS_DECODERS = new Set([
  'atob',
  'unescape',
  'decodeURIComponent',
  'decodeURI',
  'zlib.inflateSync',
  'zlib.gunzipSync',
  'zlib.unzipSync',
  'zlib.inflateRawSync',
  'zlib.brotliDecompressSync',
  'Buffer.from.hex',
  'Buffer.from.base64',
  'Buffer.from.base64url',
]);

/** Calls that read the network (their results and their callbacks' parameters are network data). */
export const JS_NETWORK =
  /^(?:fetch|axios(?:\.\w+)?|got(?:\.\w+)?|node-fetch|request|superagent(?:\.\w+)?|undici\.\w+|https?\.(?:get|request)|net\.(?:connect|createConnection|Socket)|tls\.connect|dgram\.createSocket|http2\.connect|WebSocket|ws|XMLHttpRequest|EventSource)$/;

/** Calls that read a file (or stdin). */
export const JS_FILE =
  /^(?:fs\.(?:readFileSync|readFile|createReadStream|readSync|read)|fs\.promises\.readFile|Deno\.readTextFile(?:Sync)?|Bun\.file)$/;

/** Modules and globals whose members fetched by a computed name hide an exec or a shell. */
export const JS_DANGEROUS_ROOTS = new Set([
  'child_process',
  'global',
  'globalThis',
  'window',
  'self',
  'vm',
  'process',
  'module',
  'require',
]);

/** Names that execute code or commands (reached through a computed name, they are obfuscation). */
export function isJsDangerous(q: string): boolean {
  return (
    JS_EXEC.has(q) ||
    JS_SHELL_STRING.has(q) ||
    JS_SUBPROCESS.has(q) ||
    q === 'require' ||
    q === 'child_process.fork' ||
    q === 'process.binding'
  );
}

/** Calls that copy the environment onward (the copy is what is judged later). */
export const JS_PROPAGATORS =
  /^(?:JSON\.stringify|Object\.(?:entries|keys|values|assign|fromEntries)|String|structuredClone|Array\.from|Buffer\.from|encodeURIComponent|btoa)$/;

/** Calls that may take the whole environment without sending it anywhere (child processes). */
export const JS_IGNORE_ENVDUMP = /^(?:child_process\.\w+|execa.*|Boolean|Number)$/;

/** Deleting calls: fs.rm / rimraf and friends. */
export const JS_DELETE =
  /^(?:fs\.(?:rmSync|rm|rmdirSync|rmdir|removeSync|remove|emptyDirSync|emptyDir)|fs\.promises\.(?:rm|rmdir)|rimraf(?:\.sync)?|rimrafSync|del(?:\.sync)?|deleteSync)$/;

/** Writing calls (a block device as the target destroys a filesystem). */
export const JS_WRITE =
  /^(?:fs\.(?:writeFileSync|writeFile|createWriteStream|openSync|open|appendFileSync)|fs\.promises\.(?:writeFile|open))$/;
