// Registration of the commands that act on a server's sandboxes (ps, create, exec, logs, kill, cp):
// commander wiring only; cli/remote.ts, which they run, is imported when one of them runs.
import { Option, type Command } from 'commander';
import { CLI_BACKENDS, collect, type Io } from './defaults.js';
import type { ApiFlags, CreateFlags, ExecFlags } from './remote.js';

const remoteCli = (): Promise<typeof import('./remote.js')> => import('./remote.js');

const API_HELP = `
Server:
  These commands act on sandboxes of a server ("airlock serve"), which outlive this process: set
  AIRLOCK_API_URL (or pass --api URL) and AIRLOCK_API_KEY. Without a server they fail with exit 2;
  "airlock run" runs one command in a local sandbox instead.
`;

/** ps, create, exec, logs, kill, cp: the CLI against a server (cli/remote.ts). */
export function registerRemoteCommands(program: Command, io: Io, setStatus: (code: number) => void): void {
  const api = (c: Command): Command =>
    c.option('--api <url>', 'server URL (default: AIRLOCK_API_URL)').addHelpText('after', API_HELP);
  api(program.command('ps').description("list the server's sandboxes (of this API key's tenant)"))
    .option('--metadata <KEY=VALUE>', 'only sandboxes with this metadata (repeatable)', collect, [])
    .option('--json', 'machine-readable list')
    .action(async (f: ApiFlags & { json?: boolean; metadata: string[] }) =>
      setStatus(await (await remoteCli()).psCommand(f, io)),
    );
  api(program.command('create').description('create a sandbox on the server and print its id'))
    .addOption(new Option('--backend <name>', 'isolation tier').choices(CLI_BACKENDS))
    .option('--template <NAME|DIGEST>', 'start from a template on the server')
    .option('--ttl <duration>', 'sandbox lifetime, e.g. 30m (default 10m)')
    .option('--memory <size>', 'memory limit, e.g. 256m')
    .option('--cpus <n>', 'CPU limit, e.g. 0.5')
    .option('--pids <n>', 'max processes/threads')
    .option('--disk <size>', 'writable disk size, e.g. 1g')
    .option('-e, --env <NAME=VALUE>', 'environment variable (repeatable)', collect, [])
    .option('--metadata <KEY=VALUE>', 'metadata (repeatable)', collect, [])
    .option('--json', 'print the sandbox as JSON')
    .action(async (f: CreateFlags) => setStatus(await (await remoteCli()).createCommand(f, io)));
  api(program.command('exec').description("run a command in a server's sandbox, streaming its output"))
    .usage('[flags] ID [--] CMD [ARGS...]')
    .argument('<ID>', 'sandbox id')
    .argument('<CMD...>', 'command and arguments (as for "airlock run")')
    .option('-e, --env <NAME=VALUE>', 'environment variable for this command (repeatable)', collect, [])
    .option('--cwd <dir>', 'working directory inside the sandbox (default /workspace)')
    .option('--timeout <duration>', 'kill the command after this long (default 60s)')
    .option('-i, --stdin', "forward airlock's stdin to the command (default: none)")
    .option('--background', 'start it in the background and print its process id (see "airlock logs")')
    .passThroughOptions()
    .addHelpText('after', "\nExit status: the command's (128 + signal number if a signal ended it).\n")
    .action(async (id: string, cmd: string[], f: ExecFlags) => {
      const ac = new AbortController();
      const stop = (): void => ac.abort();
      process.once('SIGINT', stop);
      try {
        setStatus(await (await remoteCli()).execCommand(id, cmd, f, io, ac.signal));
      } finally {
        process.removeListener('SIGINT', stop);
      }
    });
  api(
    program.command('logs').description('output of a background process (so far, then live) until it exits'),
  )
    .argument('<ID>', 'sandbox id')
    .argument('<PID>', 'process id printed by "airlock exec --background"')
    .addHelpText('after', "\nExit status: the process's.\n")
    .action(async (id: string, pid: string, f: ApiFlags) =>
      setStatus(await (await remoteCli()).logsCommand(id, pid, f, io)),
    );
  api(program.command('kill').description('kill sandboxes of the server'))
    .argument('<ID...>', 'sandbox ids')
    .action(async (ids: string[], f: ApiFlags) => setStatus(await (await remoteCli()).killCommand(ids, f)));
  api(program.command('cp').description('copy a file between this machine and a sandbox'))
    .argument('<SRC>', 'ID:/path in a sandbox, or a local path ("-": stdin)')
    .argument('<DST>', 'ID:/path in a sandbox, or a local path ("-": stdout)')
    .action(async (src: string, dst: string, f: ApiFlags) =>
      setStatus(await (await remoteCli()).cpCommand(src, dst, f, io, process.stdout)),
    );
}
