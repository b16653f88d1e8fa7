// A command given as an argv array is started through the sandbox's /bin/sh (the host's, read-only)
// with a few lines that check it first, so a command that cannot run fails the way a shell says it
// on every tier: one line on stderr, exit 127 when it is not found, 126 when it is found but cannot
// be run (a directory, a file without execute permission). Otherwise the launcher would answer with
// its own text (bwrap: "bwrap: execvp …", exit 1; runsc: a paragraph about its sandbox, exit 128).
// The shell then execs the command itself: same pid, same argv, same environment (see PWD below).
// A shell-string command already runs in /bin/sh -c and gets the shell's own answer.

/**
 * The check. $1 is the command; the rest of "$@" its arguments. A name without a slash is looked up
 * in PATH (`command -v`, as execvp would); a path is checked as a file. Messages name the command
 * (printf %s: nothing in it is interpreted).
 */
const CHECK = [
  // No shell variables: the environment may hold any name, and the command must get it unchanged.
  'case $1 in',
  '*/*)',
  '  if [ ! -e "$1" ]; then printf "airlock: %s: no such file or directory\\n" "$1" >&2; exit 127; fi',
  '  if [ -d "$1" ]; then printf "airlock: %s: is a directory\\n" "$1" >&2; exit 126; fi',
  '  if [ ! -x "$1" ]; then printf "airlock: %s: permission denied (not executable)\\n" "$1" >&2; exit 126; fi',
  '  ;;',
  '*)',
  '  if ! command -v "$1" >/dev/null 2>&1; then printf "airlock: %s: command not found\\n" "$1" >&2; exit 127; fi',
  '  ;;',
  'esac',
].join('\n');

/** `sh -c` names itself after this in its own messages ($0). */
const SHELL_NAME = 'airlock-exec';

/**
 * argv → the argv that runs it behind the check. `env` is the process's complete environment: dash
 * exports PWD (set to the cwd) when the environment has none, so the check unsets it again, and puts
 * back a PWD the environment gave (dash would replace one that is not the cwd).
 */
export function checkedArgv(argv: readonly string[], env: Readonly<Record<string, string>>): string[] {
  const pwd = Object.hasOwn(env, 'PWD') ? `PWD=${shellQuote(env.PWD!)}; export PWD` : 'unset PWD';
  return ['/bin/sh', '-c', `${CHECK}\n${pwd}\nexec "$@"`, SHELL_NAME, ...argv];
}

function shellQuote(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}
