// The rules of the code analysis: a stable id, a default severity, the languages it reads and the
// reason a finding gives, written for the model that wrote the code (what is wrong, what to do
// instead). docs/guides/code-analysis.md describes each. Pure data.
import type { CodeLanguage, CodeSeverity } from '../../core/code.js';

export const CODE_RULE_IDS = [
  'shell-injection',
  'eval-untrusted',
  'obfuscated-exec',
  'credential-read',
  'literal-ip-network',
  'process-tamper',
  'sandbox-escape-probe',
  'destructive-fs',
  'dynamic-import',
  'parse-error',
  'analysis-limit',
] as const;
/** The id of one code-analysis rule. */
export type CodeRuleId = (typeof CODE_RULE_IDS)[number];

/** One rule: what `analyzeCode` reports under this id. */
export interface CodeRule {
  readonly id: CodeRuleId;
  /** The default severity; a finding may carry a higher one (e.g. the cloud metadata address). */
  readonly severity: CodeSeverity;
  readonly reason: string;
  readonly languages: readonly CodeLanguage[];
}

const ALL = ['python', 'javascript', 'typescript', 'bash'] as const;

/** Every rule, in the order findings of one position are listed. */
export const CODE_RULES: readonly CodeRule[] = [
  {
    id: 'shell-injection',
    severity: 'high',
    reason:
      'A shell command is built from a non-literal string (a variable, an f-string or template, a concatenation or input), so the data can inject shell syntax. Pass a literal argv list without a shell (subprocess.run(["ls", path]), execFile("ls", [path])) instead.',
    languages: ALL,
  },
  {
    id: 'eval-untrusted',
    severity: 'high',
    reason:
      'Code read from the network, a file, the environment or input is evaluated or executed (eval/exec/Function/vm, a deserialiser, or a download piped to a shell). Parse data as data (json.loads, JSON.parse) and never run what you fetched.',
    languages: ALL,
  },
  {
    id: 'obfuscated-exec',
    severity: 'high',
    reason:
      'Decoded or assembled text (base64, hex, zlib, rot13, marshal, chr/fromCharCode) is executed, or exec/eval/system is reached through a computed name. Write the code you mean to run in plain text.',
    languages: ALL,
  },
  {
    id: 'credential-read',
    severity: 'high',
    reason:
      'The code reads a credential store (SSH keys, cloud or kube credentials, .netrc, git credentials, /etc/shadow, another process environment) or dumps the whole environment. The sandbox holds no credentials of yours: ask the user for what the task needs instead.',
    languages: ALL,
  },
  {
    id: 'literal-ip-network',
    severity: 'medium',
    reason:
      'A network call goes to a literal IP address (the cloud metadata address, a private range or a raw host) rather than a named service. Use the host name of the service the task names; the metadata address is never a legitimate target.',
    languages: ALL,
  },
  {
    id: 'process-tamper',
    severity: 'high',
    reason:
      'The code tampers with processes or the kernel: ptrace, raw syscalls through ctypes/cffi, /proc/*/mem or /dev/mem, LD_PRELOAD, process_vm_writev, mount/unshare/setns/nsenter. None of this is needed for ordinary work; do the task with normal library calls.',
    languages: ALL,
  },
  {
    id: 'sandbox-escape-probe',
    severity: 'medium',
    reason:
      'The code probes the sandbox boundary: /proc/1/root, container runtime sockets, cgroup release_agent, core_pattern, kernel modules or bpf. Work inside the sandbox instead of inspecting its walls.',
    languages: ALL,
  },
  {
    id: 'destructive-fs',
    severity: 'medium',
    reason:
      'The code deletes or overwrites a whole filesystem or device (rm -rf /, rmtree of /, mkfs, dd to /dev). Delete only the paths your task created.',
    languages: ALL,
  },
  {
    id: 'dynamic-import',
    severity: 'medium',
    reason:
      'A module or attribute name is computed at run time (__import__, importlib, require or import() of a variable, getattr of a sensitive module with a computed name), which hides what the code loads. Import modules by their literal names.',
    languages: ALL,
  },
  {
    id: 'parse-error',
    severity: 'low',
    reason:
      'Most of the code does not parse as the declared language, so the analysis could not read it. Check the language option and the syntax.',
    languages: ALL,
  },
  {
    id: 'analysis-limit',
    severity: 'high',
    reason:
      'The code is too large (over 256 KiB) or took too long to parse, so it was not analysed. Split it into smaller cells.',
    languages: ALL,
  },
];

const BY_ID = new Map(CODE_RULES.map((r) => [r.id, r]));

/** The rule with this id. */
export function codeRule(id: CodeRuleId): CodeRule {
  return BY_ID.get(id)!;
}
