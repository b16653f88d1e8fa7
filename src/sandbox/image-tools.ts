// Airlock's own in-sandbox commands on an image root. An image may have no shell, no coreutils, or
// BusyBox's instead of GNU's: the exec check, sbx.files and sbx.workspace then run on the static
// helper the tiers bind read-only at IMAGE_HELPER_PATH (the host's busybox-static), never on the
// image's programs, and never on the host's /usr (which the sandbox does not see).
//
// The helper's shell prefers its own applets to PATH for a bare name (BusyBox "standalone shell"), so
// the exec check looks the command up in PATH itself and execs it by path: `sbx.exec(['ls'])` runs
// the image's ls, and a name the image lacks is "command not found" (127), not a host applet.
import { IMAGE_HELPER_PATH } from '../backends/host/layout.js';

const H = IMAGE_HELPER_PATH;

/**
 * The exec check (exec-check.ts) for the helper's shell: $1 is the command, the rest its arguments.
 * No shell variables in the shell that execs the command (its environment must reach it unchanged):
 * the PATH lookup runs in a command substitution, and the argv is rebuilt from the positional
 * parameters by eval (the generated text holds only "${N}" references).
 */
const IMAGE_CHECK = [
  'case $1 in',
  '*/*)',
  '  if [ ! -e "$1" ]; then printf "airlock: %s: no such file or directory\\n" "$1" >&2; exit 127; fi',
  '  if [ -d "$1" ]; then printf "airlock: %s: is a directory\\n" "$1" >&2; exit 126; fi',
  '  if [ ! -x "$1" ]; then printf "airlock: %s: permission denied (not executable)\\n" "$1" >&2; exit 126; fi',
  '  set -- "$1" "$@"',
  '  ;;',
  '*)',
  '  set -- "$(IFS=:; for d in ${PATH-}; do [ -n "$d" ] || d=.; if [ -f "$d/$1" ] && [ -x "$d/$1" ]; then printf %s "$d/$1"; break; fi; done)" "$@"',
  '  if [ -z "$1" ]; then printf "airlock: %s: command not found\\n" "$2" >&2; exit 127; fi',
  '  ;;',
  'esac',
].join('\n');
/** $1 = path, $2 = argv[0], then the arguments. */
const IMAGE_EXEC =
  'eval "exec -a \\"\\$2\\" \\"\\$1\\"$(i=3; while [ $i -le $# ]; do printf \' "${%d}"\' $i; i=$((i+1)); done)"';

/** An exec's argv behind the check, on the helper's shell (see checkedArgv for `env`). */
export function imageCheckedArgv(argv: readonly string[], env: Readonly<Record<string, string>>): string[] {
  const pwd = Object.hasOwn(env, 'PWD') ? `PWD=${shellQuote(env.PWD!)}; export PWD` : 'unset PWD';
  return [H, 'sh', '-c', `${IMAGE_CHECK}\n${pwd}\n${IMAGE_EXEC}`, 'airlock-exec', ...argv];
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * One entry per argument (paths relative to the cwd, "./x"), NUL-separated fields as GNU find's
 * -printf would give them: `list` = %y %s %m %T@ %f, `tree` = %y %s %m %T@ %l %P. BusyBox's find
 * has no -printf; its stat gives whole seconds only.
 */
const ENTRY = (fields: 'list' | 'tree'): string =>
  [
    'B=$0',
    'for e; do',
    '  t=$($B stat -c %F -- "$e") || continue',
    '  case $t in "regular file"|"regular empty file") y=f;; directory) y=d;; "symbolic link") y=l;; fifo) y=p;; socket) y=s;; *) y=o;; esac',
    '  x=$($B stat -c "%s %a %Y" -- "$e") || continue',
    '  s=${x%% *}; x=${x#* }; m=${x%% *}; T=${x#* }',
    '  printf "%s\\0%s\\0%s\\0%s\\0" "$y" "$s" "$m" "$T"',
    fields === 'list'
      ? '  printf "%s\\0" "${e##*/}"'
      : '  if [ "$y" = l ]; then l=$($B readlink -- "$e"); else l=; fi; printf "%s\\0%s\\0" "$l" "${e#./}"',
    'done',
  ].join('\n');

/**
 * A host-root helper argv (files.ts, workspace.ts) → the same on the image helper. Unknown commands
 * are returned unchanged (they then run from the image, if it has them).
 */
export function imageHelperArgv(argv: readonly string[]): string[] {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case '/bin/sh':
    case '/bin/cat':
    case '/bin/rm':
    case '/usr/bin/test':
      return [H, cmd.slice(cmd.lastIndexOf('/') + 1), ...rest];
    case '/usr/bin/find':
      return findArgv(rest);
  }
  return [...argv];
}

/** The two find calls Airlock makes (files.list, workspace's tree), emulated (see ENTRY). */
function findArgv(args: readonly string[]): string[] {
  const dir = args[0]!;
  const printf = args[args.indexOf('-printf') + 1];
  const tree = printf?.includes('%P') === true;
  // find's own options between the start dir and -printf (-mindepth, -maxdepth, -name … -prune -o).
  const opts = args.slice(1, args.indexOf('-printf'));
  const script = `cd -- "$1" || exit 1; shift; exec "$0" find . "$@" -exec "$0" sh -c "$ENTRY_SCRIPT" "$0" {} +`;
  // The entry script travels as an argument, not in the environment.
  return [
    H,
    'sh',
    '-c',
    script.replace('"$ENTRY_SCRIPT"', shellQuote(ENTRY(tree ? 'tree' : 'list'))),
    H,
    dir,
    ...opts,
  ];
}
