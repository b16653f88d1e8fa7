// The sandbox contract against the WASM tier (Pyodide and QuickJS in worker threads). The tier has no
// shell, no programs but python- and node-like ones and a few builtins (echo, true, false, sleep,
// cat, pwd), no host dirs, no processes, no network: the tests that need those are declared skips,
// each with its reason; what the tier promises instead is tested in test/wasm/.
import { afterAll, describe, expect, it, vi } from 'vitest';
import { wasmThreads } from '../../src/backends/wasm/thread.js';
import { sandboxContract } from './sandbox.contract.js';

const NO_SHELL =
  'the wasm tier has no shell: a string command is split into words and shell syntax is refused (docs/wasm.md)';
const NO_PROGRAM = (p: string): string =>
  `${p} is not a command on the wasm tier (only python, node and a few builtins)`;
const NO_HOST_DIRS = 'the wasm tier has no host dirs (its filesystem is in memory): the spec is refused';
const NO_UID =
  'hostUid: wasm sandboxes run in the Airlock process’s own worker threads, so there is no per-sandbox host uid ' +
  '(info.hostUid is that process’s uid); test/wasm/exec.test.ts checks the rest of what this test does';
const NO_PROCESSES = 'the wasm tier has no processes: one job at a time runs in the sandbox’s worker thread';
const MEMORY =
  'dd is not a command on the wasm tier; the memory cap (killedBy oom) is tested with Python and QuickJS in test/wasm/exec.test.ts';

// Each create loads Pyodide in a worker (seconds on a loaded host; the warm worker takes most of it).
vi.setConfig({ testTimeout: 240_000, hookTimeout: 240_000 });

sandboxContract('wasm', {
  skip: {
    'create with defaults': NO_UID,
    'ids are unique per sandbox': NO_UID,
    'shell string: stdout, stderr and exit code': NO_SHELL,
    'argv array arrives verbatim': NO_PROGRAM('printf'),
    'exit codes propagate': NO_SHELL,
    'a process killed by a signal reports it': NO_SHELL,
    'threads work (a seccomp policy must not break pthread_create)':
      'Pyodide is built without threads (WebAssembly without pthreads): threading.Thread.start raises',
    'stdin: string, Uint8Array and Readable': NO_PROGRAM('base64'),
    'without stdin a reader sees EOF at once': NO_SHELL,
    'per-exec env overrides spec env': NO_PROGRAM('env'),
    'spec env is the only env: nothing of the host leaks': `${NO_PROGRAM('env')}; test/wasm/exec.test.ts and runcode.test.ts check os.environ against a host canary`,
    'a command that cannot run exits 127 or 126 with one clear line, argv and shell form':
      'the setup needs a shell and 126 (found, not executable) has no meaning without programs; ' +
      'test/wasm/exec.test.ts checks the 127 line for argv and string forms',
    'concurrent execs in one sandbox keep their outputs apart': NO_SHELL,
    'onStdout/onStderr receive all output in order': NO_SHELL,
    'callbacks still see everything when the result is truncated': NO_PROGRAM('seq'),
    'output streams while the process runs': `${NO_SHELL}; stdin is read whole before a job starts`,
    'background wait() gives the full output': NO_SHELL,
    'background execs run alongside foreground ones': `${NO_SHELL}; ${NO_PROCESSES}`,
    'aborting mid-exec kills it': NO_SHELL,
    'timeout kills the whole process tree': NO_PROCESSES,
    'truncation keeps head and tail and spills the full output': NO_PROGRAM('seq'),
    'stderr is truncated independently': NO_PROGRAM('seq'),
    'both streams truncated spill to separate files': NO_PROGRAM('seq'),
    'output exactly at the limit is not truncated': NO_PROGRAM('head'),
    'write and read bytes: all 256 values round-trip': `${NO_PROGRAM('sha256sum')}; test/wasm/exec.test.ts hashes in Python`,
    'nested directories are created': NO_SHELL,
    'list returns entries with type and size': `${NO_SHELL}; test/wasm/exec.test.ts lists entries Python made`,
    'files see the sandbox, not the host':
      'the in-memory filesystem has no /etc; test/wasm/exec.test.ts checks host files are unreachable',
    'symlinks are resolved inside the sandbox': `${NO_SHELL}; test/wasm/exec.test.ts plants a link with Python`,
    "workspace 'empty' is empty and writable": NO_SHELL,
    "workspace 'cow' sees the host files and keeps its writes": NO_HOST_DIRS,
    "workspace 'cow' lets the sandbox edit and delete the host files": NO_HOST_DIRS,
    "workspace 'ro' is readable and not writable": NO_HOST_DIRS,
    'a host dir and a host file are mounted read-only at their paths': NO_HOST_DIRS,
    'a mount defaults to the same path inside the sandbox': NO_HOST_DIRS,
    'spawn gives a live process with raw stdin/stdout/stderr pipes': `${NO_SHELL}; stdin is read whole before a job starts`,
    'memoryBytes: exceeding it is killedBy oom': MEMORY,
    'oomKills: a child killed by the OOM killer is reported while its parent lives on': NO_PROCESSES,
    'oomKills: an exec the OOM killer ends reports it with killedBy oom': MEMORY,
    'pids: a fork storm is held at the limit': `${NO_PROCESSES}: limits.pids does not apply`,
    'diskBytes: writing beyond it fails with ENOSPC':
      'the in-memory filesystem lives in the interpreter’s memory: it counts against memoryBytes, diskBytes does not apply',
    '8 sandboxes created in parallel are independent': `${NO_UID}; ${NO_SHELL}`,
  },
});

describe('wasm: no worker thread outlives the suite', () => {
  afterAll(() => {
    expect(wasmThreads()).toBeLessThanOrEqual(1); // at most the runtime's warm worker, until close()
  });
  it('leaves at most the warm worker', () => {
    expect(wasmThreads()).toBeLessThanOrEqual(1);
  });
});
