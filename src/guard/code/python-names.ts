// The Python names the rules know: what executes code, what runs a shell or a program, what decodes,
// what reads the network. Qualified names after alias resolution (python.ts). Pure data.
import type { Val } from './flow.js';

/** Module aliases that name the same thing. */
const SAME: Record<string, string> = {
  posix: 'os',
  nt: 'os',
  __builtin__: 'builtins',
  __builtins__: 'builtins',
  _pickle: 'pickle',
  cPickle: 'pickle',
  urllib2: 'urllib.request',
  commands: 'subprocess',
};

/** `builtins.eval` → `eval`, `posix.system` → `os.system`, `cPickle.loads` → `pickle.loads`. */
export function normalise(q: string): string {
  const dot = q.indexOf('.');
  const head = dot < 0 ? q : q.slice(0, dot);
  const tail = dot < 0 ? '' : q.slice(dot);
  const mapped = SAME[head] ?? head;
  if (mapped === 'builtins' && tail && !tail.startsWith('.__dict__')) return tail.slice(1);
  return mapped + tail;
}

/** Calls that execute a string as Python. */
export const EXEC = new Set(['eval', 'exec', 'execfile']);

/** Calls that run their first argument through a shell. */
export const SHELL_STRING = new Set([
  'os.system',
  'os.popen',
  'os.popen2',
  'os.popen3',
  'os.popen4',
  'subprocess.getoutput',
  'subprocess.getstatusoutput',
  'asyncio.create_subprocess_shell',
  'platform.popen',
]);

/** Calls that start a program from an argv (or, with shell=True, a shell string). */
export const SUBPROCESS = new Set([
  'subprocess.run',
  'subprocess.call',
  'subprocess.check_call',
  'subprocess.check_output',
  'subprocess.Popen',
  'asyncio.create_subprocess_exec',
  'os.execl',
  'os.execle',
  'os.execlp',
  'os.execlpe',
  'os.execv',
  'os.execve',
  'os.execvp',
  'os.execvpe',
  'os.spawnl',
  'os.spawnle',
  'os.spawnlp',
  'os.spawnlpe',
  'os.spawnv',
  'os.spawnve',
  'os.spawnvp',
  'os.spawnvpe',
  'os.posix_spawn',
  'os.posix_spawnp',
  'pty.spawn',
]);

/** The argv a SUBPROCESS call runs, from its positional arguments (undefined when not a list). */
export function argvOf(q: string, pos: readonly Val[], arg0: Val | undefined): readonly Val[] | undefined {
  if (q.startsWith('subprocess.') || q === 'pty.spawn') return arg0?.items;
  if (q === 'asyncio.create_subprocess_exec') return pos;
  if (/^os\.execl/.test(q)) return pos.slice(1);
  if (/^os\.execv/.test(q) || /^os\.posix_spawn/.test(q)) return pos[1]?.items;
  if (/^os\.spawnl/.test(q)) return pos.slice(2);
  if (/^os\.spawnv/.test(q)) return pos[2]?.items;
  return undefined;
}

/** Deserialisers that run code embedded in their input. */
export const DESERIALIZERS = new Set([
  'pickle.loads',
  'pickle.load',
  'dill.loads',
  'dill.load',
  'cloudpickle.loads',
  'jsonpickle.decode',
  'yaml.load',
  'yaml.unsafe_load',
  'yaml.load_all',
  'marshal.loads',
  'shelve.open',
]);

/** Calls whose result is decoded from an encoding that hides text. */
export const DECODERS = new Set([
  'base64.b64decode',
  'base64.b32decode',
  'base64.b16decode',
  'base64.b85decode',
  'base64.a85decode',
  'base64.decodebytes',
  'base64.decodestring',
  'base64.standard_b64decode',
  'base64.urlsafe_b64decode',
  'binascii.unhexlify',
  'binascii.a2b_hex',
  'binascii.a2b_base64',
  'bytes.fromhex',
  'bytearray.fromhex',
  'zlib.decompress',
  'gzip.decompress',
  'bz2.decompress',
  'lzma.decompress',
  'marshal.loads',
  'codecs.decode',
  'codecs.encode',
  'urllib.parse.unquote',
  'urllib.parse.unquote_to_bytes',
  'html.unescape',
]);

/** Module prefixes whose calls talk to the network (and whose results are network data). */
export const NETWORK_PREFIXES = [
  'requests.',
  'httpx.',
  'urllib.request.',
  'urllib3.',
  'aiohttp.',
  'http.client.',
  'socket.',
  'ftplib.',
  'telnetlib.',
  'smtplib.',
  'websocket.',
  'websockets.',
  'paramiko.',
  'pycurl.',
];

/** Modules whose attributes fetched by a computed name hide an exec or a shell. */
export const DANGEROUS_MODULES = new Set([
  'os',
  'subprocess',
  'builtins',
  'pty',
  'importlib',
  'ctypes',
  'sys',
  'asyncio',
  'platform',
]);

/** Names that execute code or commands (reached through a computed name, they are obfuscation). */
export function isDangerous(q: string): boolean {
  return (
    EXEC.has(q) ||
    SHELL_STRING.has(q) ||
    SUBPROCESS.has(q) ||
    q === 'compile' ||
    q === '__import__' ||
    q === 'importlib.import_module' ||
    q === 'os.exec' ||
    /^ctypes\.(?:CDLL|cdll)/.test(q)
  );
}

/** libc functions that tamper with processes or the kernel when called through ctypes/cffi. */
export const LIBC_TAMPER =
  /^(?:syscall|ptrace|mount|umount2?|unshare|setns|pivot_root|chroot|process_vm_(?:writev|readv)|init_module|finit_module|bpf|personality|prctl|mprotect|memfd_create|execve)$/;

/** Calls that copy the environment onward (the copy is what is judged later). */
export const PROPAGATORS = new Set([
  'dict',
  'list',
  'tuple',
  'set',
  'sorted',
  'str',
  'repr',
  'json.dumps',
  'copy.copy',
  'copy.deepcopy',
  'collections.OrderedDict',
  'pprint.pformat',
  'enumerate',
  'iter',
  'zip',
  'filter',
  'map',
]);

/** Calls that may take the whole environment without sending it anywhere (child processes, sizes). */
export const IGNORE_ENVDUMP =
  /^(?:len|bool|isinstance|type|id|hash|any|all|os\.exec\w*|os\.spawn\w*|os\.posix_spawnp?|subprocess\.\w+)$/;
