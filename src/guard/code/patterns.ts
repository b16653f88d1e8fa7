// SECURITY-RELEVANT: what a folded string means, independent of the language it came from: a
// sensitive path (credentials, process memory, the sandbox's walls), a literal IP address in a URL
// or host argument, a destructive delete target. Inputs are folded texts (flow.ts), where UNKNOWN
// marks a part that is not constant. Pure.
import type { CodeSeverity } from '../../core/code.js';
import { UNKNOWN } from './flow.js';
import type { CodeRuleId } from './rules.js';

export interface Match {
  readonly rule: CodeRuleId;
  readonly severity?: CodeSeverity;
}

/** `/home/u/…`, `/root/…`, `$HOME/…` and `${HOME}/…` read as `~/…`; UNKNOWN parts as `*`. */
function normalisePath(text: string): string {
  return text
    .replaceAll(UNKNOWN, '*')
    .replace(/^(?:\$\{?HOME\}?|\/root|\/home\/[^/]+|\*(?=\/\.))(?=\/|$)/, '~')
    .replace(/\/{2,}/g, '/');
}

// Credential stores. A public key and known_hosts are not secrets.
const CREDENTIAL_PATHS: readonly RegExp[] = [
  /(?:^|\/)\.ssh(?:\/(?!known_hosts$)(?![^/]*\.pub$)[^/]*)?$/,
  /(?:^|\/)\.aws\/(?:credentials|config)$/,
  /(?:^|\/)\.aws\/?$/,
  /(?:^|\/)[._]netrc$/,
  /(?:^|\/)\.git-credentials$/,
  /^\/etc\/g?shadow-?$/,
  /^\/etc\/(?:sudoers|master\.passwd)$/,
  /^\/proc\/[^/]+\/environ$/,
  /(?:^|\/)\.kube\/config$/,
  /^\/(?:var\/)?run\/secrets\/kubernetes\.io\/serviceaccount(?:\/token)?\/?$/,
  /(?:^|\/)\.config\/gcloud(?:\/(?:credentials\.db|access_tokens\.db|application_default_credentials\.json|legacy_credentials.*))?\/?$/,
  /(?:^|\/)\.azure\/(?:accessTokens\.json|msal_token_cache\.(?:json|bin))$/,
  /(?:^|\/)\.docker\/config\.json$/,
  /(?:^|\/)\.(?:npmrc|pypirc)$/,
  /(?:^|\/)\.gnupg(?:\/private-keys-v1\.d.*|\/secring\.gpg)?\/?$/,
  /(?:^|\/)\.config\/gh\/hosts\.yml$/,
  /^\/etc\/ssh\/ssh_host_[a-z0-9]+_key$/,
  /(?:^|\/)(?:Login Data|Cookies)$/,
  /^\/var\/lib\/cloud\/instances?\/.*user-data/,
];

const TAMPER_PATHS: readonly RegExp[] = [
  /^\/proc\/[^/]+\/mem$/,
  /^\/dev\/(?:k?mem|port)$/,
  /^\/etc\/ld\.so\.preload$/,
];

const PROBE_PATHS: readonly RegExp[] = [
  /^\/proc\/1\/(?:root|ns|cgroup|mountinfo|exe)(?:\/.*)?$/,
  /(?:^|\/)(?:docker|containerd|crio|podman|dockershim)\.sock$/,
  /^\/(?:var\/)?run\/?$/,
  /(?:^|\/)release_agent$/,
  /(?:^|\/)notify_on_release$/,
  /^\/proc\/sys\/kernel\/(?:core_pattern|modprobe|unprivileged_bpf_disabled)$/,
  /^\/proc\/(?:sysrq-trigger|kallsyms|kcore)$/,
  /^\/sys\/kernel\/(?:debug|security|uevent_helper)(?:\/.*)?$/,
  /^\/lib\/modules(?:\/.*)?$/,
  /^\/\.dockerenv$/,
  /^\/sys\/fs\/bpf(?:\/.*)?$/,
];

/**
 * The rule a path-like string falls under, or null. Only strings that look like one path (no white
 * space, starting at `/`, `~` or `$HOME`) count: a sentence that mentions ~/.ssh is not a read.
 */
export function pathMatch(text: string): Match | null {
  if (text.length > 4096 || /\s/.test(text.replaceAll(UNKNOWN, ''))) return null;
  if (!/^(?:\/|~|\$\{?HOME\}?|\.[a-z]|\*\/\.)/.test(text.replaceAll(UNKNOWN, '*'))) return null;
  const p = normalisePath(text);
  if (TAMPER_PATHS.some((r) => r.test(p))) return { rule: 'process-tamper' };
  if (CREDENTIAL_PATHS.some((r) => r.test(p))) return { rule: 'credential-read' };
  if (PROBE_PATHS.some((r) => r.test(p))) return { rule: 'sandbox-escape-probe' };
  return null;
}

const METADATA_IPS = new Set(['169.254.169.254', '169.254.170.2', '100.100.100.200', '[fd00:ec2::254]']);
const METADATA_HOSTS = new Set(['metadata.google.internal', 'metadata', 'metadata.azure.com']);

/** The host of one URL-ish or host-ish string, normalised by WHATWG URL rules (decimal, hex, octal IPv4). */
function hostOf(text: string): string | null {
  const t = text.trim();
  const m = /^([a-z][a-z0-9+.-]*:\/\/)?(?:[^@/\s]*@)?(\[[0-9a-f:.]+\]|[^/:?#\s]+)/i.exec(t);
  if (!m) return null;
  const host = m[2]!;
  if (host.includes(UNKNOWN)) return null;
  // Without a scheme, only a dotted quad, a bracketed IPv6 or a name counts as a host: a bare
  // number (a port, a timeout) is not an address, though URL parsing would read it as one.
  if (!m[1] && !/^(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:.]+\]|[a-z][a-z0-9.-]*)$/i.test(host)) return null;
  try {
    return new URL(`http://${host}/`).hostname;
  } catch {
    return null;
  }
}

/** True for an IPv4 dotted quad or a bracketed IPv6 address. */
function isIp(host: string): boolean {
  return /^\d{1,3}(?:\.\d{1,3}){3}$/.test(host) || /^\[[0-9a-f:.]+\]$/i.test(host);
}

/** Loopback and the unspecified address are the sandbox's own; they are not reported. */
function isLocal(host: string): boolean {
  return /^127\./.test(host) || host === '0.0.0.0' || host === '[::1]' || host === '[::]';
}

/**
 * The literal-ip-network finding for a string used as a URL or host of a network call: high for a
 * cloud metadata address (by IP or by name), medium for any other literal IP, null otherwise.
 */
export function ipMatch(text: string): Match | null {
  const host = hostOf(text);
  if (host === null) return null;
  if (METADATA_IPS.has(host) || METADATA_HOSTS.has(host)) {
    return { rule: 'literal-ip-network', severity: 'high' };
  }
  if (isIp(host) && !isLocal(host)) return { rule: 'literal-ip-network' };
  return null;
}

/** Every `/dev/tcp/HOST/PORT` (bash's socket paths) in a word, as a literal-ip-network match. */
export function devTcpMatch(text: string): Match | null {
  const m = /\/dev\/(?:tcp|udp)\/([^/\s]+)/.exec(text);
  if (!m) return null;
  return ipMatch(m[1]!) ?? (m[1]!.includes(UNKNOWN) ? { rule: 'literal-ip-network' } : null);
}

/** Targets whose recursive delete destroys the system or the user's home. */
export function isDestructiveTarget(text: string): boolean {
  const p = text.replaceAll(UNKNOWN, '').replace(/\/+$/, '') || '/';
  return /^(?:\/|\/\*|~|~\/\*|\$\{?HOME\}?|\$\{?HOME\}?\/\*|\/(?:home|etc|usr|var|bin|sbin|boot|lib|lib64|root|opt|srv|sys|dev)(?:\/\*)?|\/\*\/?\*?)$/.test(
    p,
  );
}

/** Names of decoders a shell pipeline can run data through before executing it. */
export const SHELL_DECODERS = new Set([
  'base64',
  'base32',
  'xxd',
  'openssl',
  'rev',
  'tr',
  'gunzip',
  'zcat',
  'gzip',
  'bzip2',
  'bunzip2',
  'xz',
  'unxz',
  'uudecode',
  'printf',
]);

/** Programs that read from the network. */
export const SHELL_FETCHERS = new Set([
  'curl',
  'wget',
  'nc',
  'ncat',
  'netcat',
  'fetch',
  'http',
  'socat',
  'lwp-download',
]);

/** Interpreters that run what they read on stdin or from -c/-e. */
export const SHELLS = new Set(['sh', 'bash', 'zsh', 'dash', 'ksh', 'ash', 'busybox', 'fish', 'csh', 'tcsh']);
export const INTERPRETERS = new Set([
  'python',
  'python2',
  'python3',
  'perl',
  'ruby',
  'node',
  'php',
  'lua',
  'bun',
  'deno',
]);

/** A block device (writing to it destroys a filesystem). */
export function isBlockDevice(text: string): boolean {
  return /^\/dev\/(?:sd|hd|vd|xvd|nvme|mmcblk|dm-|md\d|disk)/.test(text);
}
