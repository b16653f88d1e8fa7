// Airlock's JavaScript kernel (src/sandbox/code/kernel.ts starts it inside the sandbox as
// `node -e SRC`). Cells run as scripts in this process's global context, so top-level `var`, `let`,
// `const`, functions and globals persist from one cell to the next (as in a browser's script tags).
// The completion value of a cell is its main result. A cell that uses `await` at top level runs
// wrapped in an async function: its simple `const|let|var name =` declarations at the start of a
// line become globals, and the value of its last line, when that line is an expression, is returned.
//
// Protocol: as the Python kernel's (kernels/python.py): JSON requests on stdin, raw output on fd 1/2,
// frames in-band on stdout as \x1e\x1eAL:<id>:<json>\n, {"t":"end"} then the stderr end line.
/* global require, process, Buffer */
/* eslint-disable @typescript-eslint/no-require-imports -- a CommonJS program run by `node -e` */
'use strict';
const vm = require('node:vm');
const util = require('node:util');
const fs = require('node:fs');
const readline = require('node:readline');

globalThis.require = require;
let runId = '';
let cellNo = 0;
const MAX_JSON = 1 << 20;

function writeAll(fd, text) {
  const buf = Buffer.from(text, 'utf8');
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(fd, buf, off);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

function frame(obj) {
  writeAll(1, `\x1e\x1eAL:${runId}:${JSON.stringify(obj)}\n`);
}

function reprs(value, isMainResult) {
  const out = { t: 'result', isMainResult };
  try {
    out.text = typeof value === 'string' ? value : util.inspect(value, { depth: 4 });
  } catch (e) {
    out.text = `<inspect failed: ${e}>`;
  }
  if (value !== null && typeof value === 'object') {
    try {
      const j = JSON.stringify(value);
      if (j !== undefined && j.length <= MAX_JSON) out.json = JSON.parse(j);
    } catch {
      /* not serialisable: text only */
    }
  }
  return out;
}

globalThis.display = (value) => frame(reprs(value, false));

/** A stack cut where the kernel's own frames start (the cell's are above them). */
function cellStack(stack) {
  const lines = stack.split('\n');
  const i = lines.findIndex((l) => /^\s+at .*(node:vm|\[eval\])/.test(l));
  return (i > 0 ? lines.slice(0, i) : lines).join('\n');
}

function errorFrame(e) {
  const isErr = e instanceof Error || (e && typeof e === 'object' && 'stack' in e);
  frame({
    t: 'error',
    name: isErr && e.name ? String(e.name) : 'Error',
    value: isErr ? String(e.message) : String(e),
    traceback: isErr && e.stack ? cellStack(String(e.stack)) : String(e),
  });
}

// A callback that throws after its cell ended must not end the kernel: it is reported on stderr.
process.on('uncaughtException', (e) => writeAll(2, `Uncaught ${e && e.stack ? e.stack : e}\n`));
process.on('unhandledRejection', (e) => writeAll(2, `Unhandled rejection: ${e && e.stack ? e.stack : e}\n`));

/** The cell as an async function body (top-level await): see the header. */
function wrapAsync(code) {
  const body = code.replace(/^(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=/gm, 'globalThis.$1 =');
  const lines = body.replace(/\s+$/, '').split('\n');
  const last = lines.pop() ?? '';
  const head = lines.join('\n');
  const stripped = last.trim().replace(/;$/, '');
  if (
    stripped &&
    !/^(?:return|if|for|while|do|switch|try|throw|function|class|globalThis\.\w+ =|[}])/.test(stripped)
  ) {
    const candidate = `(async () => {\n${head}\nreturn (${stripped});\n})()`;
    try {
      new vm.Script(candidate);
      return candidate;
    } catch {
      /* the last line is not an expression */
    }
  }
  return `(async () => {\n${body}\n})()`;
}

async function run(code) {
  const filename = `cell-${++cellNo}.js`;
  let script;
  let wrapped = false;
  try {
    script = new vm.Script(code, { filename });
  } catch (e) {
    if (!(e instanceof SyntaxError) || !/\bawait\b/.test(code)) throw e;
    script = new vm.Script(wrapAsync(code), { filename });
    wrapped = true;
  }
  let value = script.runInThisContext({ displayErrors: false });
  if (wrapped) value = await value;
  if (value !== undefined) {
    globalThis._ = value;
    frame(reprs(value, true));
  }
}

let chain = Promise.resolve();
const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  chain = chain.then(async () => {
    const req = JSON.parse(line);
    runId = req.id;
    const envs = req.envs || {};
    const saved = {};
    for (const k of Object.keys(envs)) {
      saved[k] = process.env[k];
      process.env[k] = envs[k];
    }
    try {
      await run(req.code);
    } catch (e) {
      errorFrame(e);
    } finally {
      for (const k of Object.keys(saved)) {
        if (saved[k] === undefined) delete process.env[k];
        else process.env[k] = saved[k];
      }
    }
    frame({ t: 'end' });
    writeAll(2, `\x1e\x1eAL:${runId}:end\n`);
  });
});
rl.on('close', () => process.exit(0));
