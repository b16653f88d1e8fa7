// SECURITY-RELEVANT: the rules on shell code, read from the bash syntax tree: each command's argv
// (folded: literal words, quoted strings, variables assigned a literal earlier in the script,
// $HOME as ~), the pipelines it sits in and its redirections. Python and JavaScript hand their literal
// command strings (os.system("…"), execSync("…")) and argv lists here too, through the Sink.
import type { Node } from 'web-tree-sitter';
import { Env, UNKNOWN, kids, lit, type Sink, type Val } from './flow.js';
import {
  INTERPRETERS,
  SHELL_DECODERS,
  SHELL_FETCHERS,
  SHELLS,
  devTcpMatch,
  ipMatch,
  isDestructiveTarget,
  pathMatch,
} from './patterns.js';

/** One argv element: its folded text, and the programs run in its command substitutions. */
interface Arg {
  readonly text: string;
  readonly literal: boolean;
  readonly inner: ReadonlySet<string>;
}

const NETWORK_CLIENTS = new Set([
  ...SHELL_FETCHERS,
  'ssh',
  'scp',
  'sftp',
  'telnet',
  'ftp',
  'rsync',
  'ping',
  'nmap',
  'dig',
  'nslookup',
]);
const WRAPPERS = new Set([
  'sudo',
  'doas',
  'nohup',
  'exec',
  'command',
  'builtin',
  'time',
  'nice',
  'ionice',
  'stdbuf',
  'xargs',
  'setsid',
  'chrt',
  'timeout',
]);
const ENV_DUMPERS = new Set(['env', 'printenv', 'export', 'declare', 'set', 'compgen']);
const TAMPER_PROGRAMS = new Set(['nsenter', 'unshare', 'setns', 'pivot_root', 'chroot', 'capsh', 'ptrace']);
const PROBE_PROGRAMS = new Set(['insmod', 'modprobe', 'rmmod', 'kexec', 'bpftool', 'bpftrace']);
const MKFS = /^(?:mkfs(?:\.[a-z0-9]+)?|mke2fs|mkswap|wipefs|sfdisk|fdisk|parted)$/;
const BLOCK_DEVICE = /^\/dev\/(?:sd|hd|vd|xvd|nvme|mmcblk|loop|dm-|md|disk)/;

function base(text: string): string {
  return text.slice(text.lastIndexOf('/') + 1);
}

/** The programs a pipeline's elements or a substitution's commands run (first words). */
function programsIn(node: Node): Set<string> {
  const out = new Set<string>();
  for (const c of node.descendantsOfType('command')) {
    const name = c?.childForFieldName('name');
    if (name) out.add(base(name.text.replace(/^['"]|['"]$/g, '')));
  }
  return out;
}

/** The verdict on code that is executed after passing through `programs`. */
function classifyExecuted(programs: ReadonlySet<string>): 'obfuscated-exec' | 'eval-untrusted' | null {
  for (const p of programs) if (SHELL_DECODERS.has(p)) return 'obfuscated-exec';
  for (const p of programs) if (SHELL_FETCHERS.has(p)) return 'eval-untrusted';
  return null;
}

/** The command a wrapper runs (sudo rm …, timeout 5 sh -c …, env X=1 cmd); LD_PRELOAD=… on env is reported. */
function unwrap(args: readonly Arg[], node: Node, sink: Sink): readonly Arg[] {
  let argv = args;
  // Wrappers (sudo rm …, timeout 5 sh -c …, env X=1 cmd) run the command after them.
  while (argv.length > 0) {
    const w = base(argv[0]!.text);
    if (w === 'env' && argv.length > 1) {
      for (const a of argv.slice(1))
        if (/^LD_(?:PRELOAD|AUDIT)=/.test(a.text)) sink.report('process-tamper', node);
      const rest = argv
        .slice(1)
        .findIndex((a) => !a.text.startsWith('-') && !/^[A-Za-z_][A-Za-z0-9_]*=/.test(a.text));
      if (rest < 0) return [];
      argv = argv.slice(1 + rest);
    } else if (WRAPPERS.has(w) && argv.length > 1) {
      const rest = argv.slice(1).findIndex((a) => !a.text.startsWith('-') && !/^\d+[smhd]?$/.test(a.text));
      if (rest < 0) return [];
      argv = argv.slice(1 + rest);
    } else if (w === 'busybox' && argv.length > 1) {
      argv = argv.slice(1);
    } else break;
  }
  return argv;
}

export interface ArgvContext {
  /** The command's output goes to a pipe, a file or a substitution (for env dumps). */
  readonly captured: boolean;
}

/**
 * The rules on one command's argv. Shared by bash and by the argv lists Python and JavaScript pass to
 * subprocess/spawn (their non-literal elements come as non-literal args with no substitutions).
 */
export function checkArgv(args: readonly Arg[], node: Node, sink: Sink, ctx: ArgvContext): void {
  const argv = unwrap(args, node, sink);
  if (argv.length === 0) return;
  // $(echo … | base64 -d) as the command itself runs whatever the substitution prints.
  const runsOutput = classifyExecuted(argv[0]!.inner);
  if (runsOutput) sink.report(runsOutput, node);
  const cmd = base(argv[0]!.text);
  const rest = argv.slice(1);
  const operands = rest.filter((a) => !a.text.startsWith('-'));

  // Every argument that names a sensitive path (also after curl's @ and name=@).
  for (const a of rest) {
    const m = pathMatch(a.text.replace(/^(?:[A-Za-z_][\w-]*=)?@/, '').replace(/^(?:of|if)=/, ''));
    if (m) sink.report(m.rule, node, m.severity);
    const t = devTcpMatch(a.text);
    if (t) sink.report(t.rule, node, t.severity);
  }

  if (cmd === 'eval') {
    const inner = new Set(rest.flatMap((a) => [...a.inner]));
    const kind = classifyExecuted(inner);
    if (kind) sink.report(kind, node);
    else if (rest.some((a) => !a.literal && a.inner.size === 0)) sink.report('shell-injection', node);
    else if (rest.every((a) => a.literal)) sink.shell(rest.map((a) => a.text).join(' '), node);
    return;
  }
  if (SHELLS.has(cmd) || INTERPRETERS.has(cmd)) {
    // sh -c SCRIPT (also -lc, -ec, …), python -c CODE, node -e CODE, perl -e CODE.
    const flag = SHELLS.has(cmd) ? /^-[a-z]*c[a-z]*$/ : /^-[a-zA-Z]*[ce]$/;
    const at = rest.findIndex((a) => flag.test(a.text));
    const script = at >= 0 ? rest[at + 1] : undefined;
    const executed = script ? [script] : rest; // bash <(curl …), source <(…)
    const kind = classifyExecuted(new Set(executed.flatMap((a) => [...a.inner])));
    if (kind) sink.report(kind, node);
    else if (script && !script.literal) sink.report('shell-injection', node);
    else if (script && SHELLS.has(cmd)) sink.shell(script.text, node);
    return;
  }
  if (cmd === 'source' || cmd === '.') {
    const kind = classifyExecuted(new Set(rest.flatMap((a) => [...a.inner])));
    if (kind) sink.report(kind, node);
    return;
  }
  if (NETWORK_CLIENTS.has(cmd)) {
    for (const a of operands) {
      // user@host, and socat's TCP:host:port / OPENSSL:host:port addresses.
      const m = ipMatch(
        a.text.replace(/^(?:tcp|udp|openssl|ssl)[46]?(?:-connect)?:/i, '').replace(/^[^@\s/]*@/, ''),
      );
      if (m) sink.report(m.rule, node, m.severity);
    }
    for (const a of rest) {
      // curl -x/--proxy and --connect-to/--resolve forms carry their host in a flag's value.
      const v = /^--?[a-z-]+=(.*)$/.exec(a.text)?.[1];
      if (v) {
        const m = ipMatch(v);
        if (m) sink.report(m.rule, node, m.severity);
      }
    }
  }
  if (cmd === 'rm' || cmd === 'chmod' || cmd === 'chown') {
    const recursive = rest.some((a) => /^-[a-zA-Z]*[rR]|^--recursive$/.test(a.text));
    if (rest.some((a) => a.text === '--no-preserve-root')) sink.report('destructive-fs', node);
    else if (recursive && operands.some((a) => isDestructiveTarget(a.text)))
      sink.report('destructive-fs', node);
  }
  if (MKFS.test(cmd)) sink.report('destructive-fs', node);
  if (
    (cmd === 'dd' && rest.some((a) => /^of=\/dev\/(?!null$|zero$|stdout$|stderr$)/.test(a.text))) ||
    (cmd === 'shred' && operands.some((a) => BLOCK_DEVICE.test(a.text)))
  ) {
    sink.report('destructive-fs', node);
  }
  if (
    cmd === 'find' &&
    rest.some((a) => a.text === '-delete') &&
    operands.length > 0 &&
    isDestructiveTarget(operands[0]!.text)
  ) {
    sink.report('destructive-fs', node);
  }
  if (PROBE_PROGRAMS.has(cmd)) sink.report('sandbox-escape-probe', node);
  if (TAMPER_PROGRAMS.has(cmd) || (cmd === 'mount' && operands.length > 0))
    sink.report('process-tamper', node);
  if (
    (cmd === 'gdb' || cmd === 'strace' || cmd === 'ltrace') &&
    rest.some((a) => /^(?:-p|--pid|--pid=.*|-p\d+)$/.test(a.text))
  ) {
    sink.report('process-tamper', node);
  }
  if (
    ENV_DUMPERS.has(cmd) &&
    ctx.captured &&
    (operands.length === 0 || (cmd === 'export' && rest.every((a) => a.text === '-p')))
  ) {
    sink.report('credential-read', node, 'medium');
  }
}

/** An argv from another language: literal elements and unknown (null) ones. */
export function argvFromList(list: readonly (string | null)[]): Arg[] {
  return list.map((t) => ({ text: t ?? UNKNOWN, literal: t !== null, inner: new Set<string>() }));
}

/** Analyse one bash syntax tree. */
export function analyzeBash(root: Node, sink: Sink): void {
  const env = new Env();

  const fold = (n: Node | null): Val => {
    if (!n) return lit('');
    switch (n.type) {
      case 'word':
      case 'number':
      case 'command_name':
        return n.type === 'command_name' && n.firstNamedChild
          ? fold(n.firstNamedChild)
          : lit(n.text.replace(/\\(.)/g, '$1'));
      case 'raw_string':
        return lit(n.text.slice(1, -1));
      case 'ansi_c_string':
        return lit(n.text.slice(2, -1));
      case 'string_content':
        return lit(n.text);
      case 'simple_expansion':
      case 'expansion': {
        const name = n.descendantsOfType('variable_name')[0]?.text ?? '';
        if (name === 'HOME') return lit('~');
        return n.type === 'simple_expansion' || /^\$\{\w+\}$/.test(n.text)
          ? (env.get(name) ?? { text: UNKNOWN, literal: false, taint: new Set() })
          : { text: UNKNOWN, literal: false, taint: new Set() };
      }
      case 'string':
      case 'concatenation': {
        const parts: Val[] = [];
        // A string's text between its named children is literal content (tree-sitter-bash leaves
        // some content unnamed); walk all children.
        for (const c of n.children) {
          if (!c || c.text === '"') continue;
          parts.push(c.isNamed ? fold(c) : lit(c.text));
        }
        return {
          text: parts.map((p) => p.text).join(''),
          literal: parts.every((p) => p.literal),
          taint: new Set(),
        };
      }
      default:
        return { text: UNKNOWN, literal: false, taint: new Set() };
    }
  };

  const arg = (n: Node): Arg => {
    const v = fold(n);
    const inner = new Set<string>();
    for (const s of n.descendantsOfType(['command_substitution', 'process_substitution'])) {
      if (s) for (const p of programsIn(s)) inner.add(p);
    }
    if (n.type === 'command_substitution' || n.type === 'process_substitution')
      for (const p of programsIn(n)) inner.add(p);
    return { text: v.text, literal: v.literal, inner };
  };

  const captured = (n: Node): boolean => {
    for (let p = n.parent; p; p = p.parent) {
      if (p.type === 'pipeline') {
        const cs = kids(p);
        return cs[cs.length - 1]?.id !== n.id;
      }
      if (
        p.type === 'redirected_statement' ||
        p.type === 'command_substitution' ||
        p.type === 'process_substitution'
      )
        return true;
      if (p.type === 'program' || p.type === 'compound_statement' || p.type === 'do_group') return false;
    }
    return false;
  };

  const command = (n: Node): void => {
    const name = n.childForFieldName('name');
    if (!name) return;
    const args = [
      arg(name),
      ...n
        .childrenForFieldName('argument')
        .filter((c): c is Node => c !== null)
        .map(arg),
    ];
    checkArgv(args, n, sink, { captured: captured(n) });
  };

  const pipeline = (n: Node): void => {
    const cs = kids(n);
    const last = cs[cs.length - 1];
    const lastCmd = last?.type === 'redirected_statement' ? last.childForFieldName('body') : last;
    if (!lastCmd || lastCmd.type !== 'command') return;
    const argv = unwrap(
      [
        arg(lastCmd.childForFieldName('name')!),
        ...lastCmd
          .childrenForFieldName('argument')
          .filter((c): c is Node => c !== null)
          .map(arg),
      ],
      lastCmd,
      sink,
    );
    if (argv.length === 0) return;
    const name = base(argv[0]!.text);
    const args = argv.slice(1);
    const runsStdin =
      (SHELLS.has(name) && !args.some((a) => /^-[a-z]*c/.test(a.text))) ||
      (INTERPRETERS.has(name) &&
        args.every((a) => a.text === '-' || (/^-[a-zA-Z]*$/.test(a.text) && !/[ce]$/.test(a.text)))) ||
      ((name === 'source' || name === '.') &&
        args.some((a) => /^\/dev\/stdin$|^\/proc\/self\/fd\/0$/.test(a.text)));
    if (!runsStdin) return;
    const before = new Set<string>();
    for (const c of cs.slice(0, -1)) for (const p of programsIn(c)) before.add(p);
    const kind = classifyExecuted(before);
    if (kind) sink.report(kind, n);
  };

  const redirect = (n: Node): void => {
    const dest = n.childForFieldName('destination');
    if (!dest) return;
    const text = fold(dest).text;
    const m = pathMatch(text);
    if (m) sink.report(m.rule, n, m.severity);
    const t = devTcpMatch(text);
    if (t) sink.report(t.rule, n, t.severity);
    if (BLOCK_DEVICE.test(text) && /^\d*>/.test(n.text.replace(/^\s+/, ''))) sink.report('destructive-fs', n);
  };

  const assignment = (n: Node): void => {
    const name = n.childForFieldName('name')?.text ?? '';
    const value = n.childForFieldName('value');
    if (/^LD_(?:PRELOAD|AUDIT)$/.test(name)) sink.report('process-tamper', n);
    const v = fold(value);
    env.set(name, v.literal ? v : { text: UNKNOWN, literal: false, taint: new Set() });
    const t = devTcpMatch(v.text);
    if (t) sink.report(t.rule, n, t.severity);
  };

  // Source order, so a variable is folded with the value assigned before its use.
  const visit = (n: Node): void => {
    switch (n.type) {
      case 'command':
        command(n);
        break;
      case 'pipeline':
        pipeline(n);
        break;
      case 'file_redirect':
        redirect(n);
        break;
      case 'variable_assignment':
        assignment(n);
        break;
    }
    for (const c of kids(n)) visit(c);
  };
  visit(root);
}
