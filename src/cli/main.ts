#!/usr/bin/env node
// The airlock command line. This file is the one place errors become exit codes (exitCodeFor) and
// one-line messages on stderr; the commands themselves return the status they want.
import { mkdtempSync, readFileSync, realpathSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Command, CommanderError, Option } from 'commander';
import { AirlockError, ERROR_CODES, exitCodeFor } from '../core/errors.js';
import {
  CLI_BACKENDS,
  DEFAULT_MAX_OUTPUT,
  DEFAULT_TIMEOUT,
  collect,
  processIo,
  type Io,
} from './defaults.js';
import type { RunFlags } from './flags.js';
import type { DiffFlags } from './diff.js';
import type { GatewayFlags, McpFlags } from './mcp.js';
import { registerRemoteCommands } from './remote-commands.js';
import { phase, phaseLine } from './phases.js';

// Each command's module is imported when that command runs, so `--help`, `--version` and a command
// load only what they use (start-up time is paid by every MCP server start and scripted call). The
// MCP commands in particular load the MCP SDK and the tokenizer (≈0.7 s of imports).
const runCli = (): Promise<typeof import('./run.js')> => import('./run.js');
const mcpCli = (): Promise<typeof import('./mcp.js')> => import('./mcp.js');
const snapshotCli = (): Promise<typeof import('./snapshot.js')> => import('./snapshot.js');
const diffCli = (): Promise<typeof import('./diff.js')> => import('./diff.js');
const templateCli = (): Promise<typeof import('./template.js')> => import('./template.js');
const doctorCli = (): Promise<typeof import('./doctor.js')> => import('./doctor.js');
const demoCli = (): Promise<typeof import('./demo.js')> => import('./demo.js');
const serveCli = (): Promise<typeof import('./serve.js')> => import('./serve.js');
const keysCli = (): Promise<typeof import('./keys.js')> => import('./keys.js');
const remoteCli = (): Promise<typeof import('./remote.js')> => import('./remote.js');
const imageCli = (): Promise<typeof import('./image.js')> => import('./image.js');
const mcpServerCli = (): Promise<typeof import('./mcp-server.js')> => import('./mcp-server.js');

/**
 * The commands that make one sandbox and end: their program registers only them (buildProgram's
 * `oneShot`), and runAsProcess ends their process as soon as their output is out.
 */
const ONE_SHOT: readonly string[] = ['run', 'diff'];

/** Each command's module loader, by command name (the build's code-cache step loads them). */
const COMMAND_MODULES: Readonly<Record<string, () => Promise<unknown>>> = {
  run: runCli,
  mcp: mcpCli,
  snapshot: snapshotCli,
  diff: diffCli,
  template: templateCli,
  doctor: doctorCli,
  demo: demoCli,
  serve: serveCli,
  keys: keysCli,
  remote: remoteCli,
  image: imageCli,
  'mcp-server': mcpServerCli,
};

/**
 * Loads the modules of `commands` (default: every command), so that the build's code-cache step
 * (writeCliCache in bin/airlock.cjs) compiles them into the cache; the run bundle holds only some.
 */
export async function loadCommands(
  commands: readonly string[] = Object.keys(COMMAND_MODULES),
): Promise<void> {
  // The run bundle's cache is made as its commands run: with the one-shot settings (see main).
  if (commands.every((c) => ONE_SHOT.includes(c))) (await import('./one-shot.js')).tuneForOneShot();
  await Promise.all(
    commands.map((c) => {
      const load = COMMAND_MODULES[c];
      if (!load) throw new Error(`no command module "${c}"`);
      return load();
    }),
  );
  if (commands.includes('run')) (await runCli()).warmUpForCache();
}

/**
 * The build's code-cache step for the run bundle: one real `airlock run -- true` (create → exec →
 * kill), so that every function a one-shot runs is compiled into the cache, not lazily at each start
 * (issue 31). Sandboxes need root; elsewhere, or if the run fails, the cache holds what loadCommands
 * compiled, and the reason comes back for the build to print. The sandbox lives in a fresh state dir
 * of its own (uids from AIRLOCK_UID_RANGE as for any run; leases are host-wide), removed afterwards
 * unless something is still mounted under it. Never called at run time: the cache is written only
 * by the build.
 */
export async function oneShotForCache(): Promise<string | undefined> {
  if (process.getuid?.() !== 0) return 'not root, so no sandbox can be made';
  const stateDir = mkdtempSync(join(tmpdir(), 'airlock-cli-cache-'));
  const previous = process.env.AIRLOCK_STATE_DIR;
  process.env.AIRLOCK_STATE_DIR = stateDir;
  const errors: string[] = [];
  try {
    const status = await main(['run', '--', 'true'], { out: () => {}, err: (t) => void errors.push(t) });
    return status === 0 ? undefined : `airlock run -- true exited ${status}: ${errors.join('').trim()}`;
  } finally {
    if (previous === undefined) delete process.env.AIRLOCK_STATE_DIR;
    else process.env.AIRLOCK_STATE_DIR = previous;
    // Loaded here only: the state-dir code would otherwise run at every start of every command.
    (await import('../backends/host/state.js')).removeStateDir(stateDir);
  }
}

const RUN_HELP = `
Command:
  Several CMD arguments run as an argv array, without a shell:
    airlock run -- python3 -c 'print(1)'
  One CMD argument with spaces or shell syntax ( | & ; < > $ * quotes ...) runs with /bin/sh -c:
    airlock run -- 'ls /workspace | wc -l'
  One plain word runs as itself: airlock run -- date
  Flags go before CMD; "--" is optional unless CMD starts with "-".

Network:
  Without --allow/--deny/--secret/--policy the sandbox has no network at all. With any of them it gets
  an egress proxy (HTTP_PROXY etc. are set; other TCP is intercepted) that reaches only the allowed
  hosts, never private, loopback or metadata addresses; a refusal is an HTTP 403 with the reason.
    airlock run --allow api.github.com --allow '*.npm.example.com' --deny gist.github.com -- npm install
  --secret GH=env:GITHUB_TOKEN@api.github.com: the sandbox sees GH=<sentinel>; the proxy swaps in the
  real value only in requests to api.github.com (each host must also be allowed). SOURCE forms:
  env:VAR, file:/abs/path, cmd:PROGRAM ARGS (split on spaces, no shell). --policy FILE loads
  network:/secrets: from YAML; flags are merged on top (a --secret replaces a policy secret of that name).
  With --json the result lists every egress attempt under "egress".

Output and exit status:
  stdout/stderr stream live; with --json nothing streams and one ExecResult JSON is printed at the end.
  airlock exits with the command's status (128 + signal number if it died by a signal). Limits that
  ended it are named on stderr ("airlock: killed by timeout after 30s"). Airlock's own errors:
  2 bad flag or spec, 3 sandbox gone, 4 backend unavailable, 5 no capacity, 70 internal,
  130/143 interrupted (the sandbox is killed first).

Environment:
  AIRLOCK_STATE_DIR   host state (default /var/lib/airlock)
  AIRLOCK_UID_RANGE   host uids for sandboxes, FIRST:COUNT (default 3000000:65536)
`;

const MCP_HELP = `
Drop-in for an mcpServers entry: replace
  "command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."]
with
  "command": "airlock", "args": ["mcp", "--workspace", ".", "--", "npx", "-y", "@modelcontextprotocol/server-filesystem", "/workspace"]
Host paths do not exist in the sandbox: hand the server its dir with --workspace and name it /workspace
in the server's arguments. The workspace is copy-on-write (":ro" for read-only): the server's writes
are discarded when it exits.
The server runs in a sandbox with no network (unless --allow/--policy), sees only its own package files
(read-only, resolved from ./node_modules or the npx cache: nothing is downloaded) and its workspace.
Its tools are scanned and pinned (./airlock.lock.json if present, else trust on first use for the session);
changed or poisoned tools are hidden and refused. Results are truncated and redacted. Its stderr is shown
here prefixed with [name]. stdout is the MCP protocol.
`;

function version(): string {
  try {
    const pkg = fileURLToPath(new URL('../../package.json', import.meta.url));
    return (JSON.parse(readFileSync(pkg, 'utf8')) as { version?: string }).version ?? 'unknown';
  } catch {
    return 'unknown';
  }
}

const DIFF_HELP = `
The workspace is a copy-on-write view of DIR (default: the current directory): the command can change
it freely, the host dir is never written. Afterwards airlock prints the changes as a git patch
(binary files as GIT binary patch), which "git apply" run in DIR applies:
  airlock diff -- 'npm version patch --no-git-tag-version' > bump.patch && git apply bump.patch
With --out DIR2 the added and modified files are written into DIR2 (new or empty) instead, and
stdout lists every change as "A path", "M path" or "D path" (deleted paths are only listed).
.git directories are left out. A special file (fifo, socket, device) or a non-UTF-8 name among
the changes is refused (exit 1), as is a changed file over 16 MiB.

Exit status: the command's (the patch is printed either way), or airlock's own error codes as for run.
`;

/**
 * `airlock diff`, registered by main.ts after `run`: the same flags as run (copied from it, so they
 * cannot drift) except --json, plus --out; --workspace defaults to the cwd.
 */
export function registerDiffCommand(program: Command, io: Io, setStatus: (code: number) => void): void {
  const run = program.commands.find((c) => c.name() === 'run');
  const diff = program
    .command('diff')
    .description('run one command on a cow copy of a dir and print what it changed there as a git patch')
    .usage('[flags] [--out DIR] [--] CMD [ARGS...]')
    .argument('<CMD...>', 'command and arguments (as for airlock run)');
  for (const o of run?.options ?? []) {
    if (o.long === '--json') continue;
    if (o.long === '--workspace') {
      diff.addOption(
        new Option(
          '--workspace <dir>',
          'host dir the command works on, as a cow copy (default: the current directory); never written',
        ),
      );
    } else diff.addOption(o);
  }
  diff
    .option('--out <dir>', 'write the added and modified files into this new or empty dir instead of a patch')
    .passThroughOptions()
    .addHelpText('after', DIFF_HELP)
    .action(async (cmd: string[], flags: DiffFlags) =>
      setStatus(await (await diffCli()).diffCommand(cmd, flags, io)),
    );
}

/**
 * The airlock program with every command, argument and option, not yet parsed. Commands report their
 * exit status through `setStatus`. Building it loads no command module (scripts/cli-reference.ts
 * documents it from this). `oneShot`: only `run` and `diff`, exactly as in the whole program (main
 * builds that for a command line starting with either: the other ~30 commands are start-up work
 * such a line never uses).
 */
export function buildProgram(
  io: Io = processIo,
  setStatus: (code: number) => void = () => {},
  oneShot = false,
): Command {
  const program = new Command('airlock')
    .description('Disposable sandboxes for AI-agent tool calls')
    .version(version(), '-V, --version')
    .enablePositionalOptions()
    .exitOverride()
    .showHelpAfterError(false)
    .configureOutput({
      writeOut: (s) => io.out(s),
      writeErr: (s) => io.err(s),
      outputError: () => {}, // reported as one line by main()
    });

  program
    .command('run')
    .description('run one command in a fresh sandbox, then destroy it')
    .usage('[flags] [--] CMD [ARGS...]')
    .argument(
      '[CMD...]',
      'command and arguments (see "Command" below); with --image, default: its entrypoint + cmd',
    )
    .addOption(
      new Option(
        '--backend <name>',
        "isolation tier (default: namespaces, or the --template's tier)",
      ).choices(CLI_BACKENDS),
    )
    .option(
      '--template <NAME|DIGEST>',
      'start from a built template (airlock template ls): its name, or a layer digest sha256:…',
    )
    .option(
      '--image <REF>',
      "run on this image's root filesystem instead of the host's /usr (e.g. registry.example.com/team/py:3.12)",
    )
    .option('--executables <list>', 'only these programs (comma-separated) and what they need exist')
    .addOption(
      new Option('--pull <policy>', 'when to pull --image (default: missing)').choices([
        'missing',
        'always',
        'never',
      ]),
    )
    .option('--memory <size>', 'memory limit, e.g. 256m (default 512m)')
    .option('--cpus <n>', 'CPU limit, e.g. 0.5 (default 1)')
    .option('--pids <n>', 'max processes/threads (default 256)')
    .option('--disk <size>', 'writable disk size, e.g. 1g (default 512m)')
    .option('--timeout <duration>', 'kill the command after this long, e.g. 30s', DEFAULT_TIMEOUT)
    .option('--ttl <duration>', 'sandbox lifetime, e.g. 2m (default: 10m, or timeout + 30s if longer)')
    .option(
      '--workspace <dir[:cow|ro]>',
      'host dir as /workspace: cow (default: writes go to a copy and are DISCARDED when the sandbox ends; take them back with "airlock diff") or ro',
    )
    .option(
      '-e, --env <NAME=VALUE>',
      'environment variable (repeatable); the host env is never passed',
      collect,
      [],
    )
    .option(
      '--max-output <bytes>',
      'bytes of stdout and of stderr kept in the --json result',
      DEFAULT_MAX_OUTPUT,
    )
    .option(
      '--allow <host[:port]>',
      'let the sandbox reach this host (repeatable); no port: 80 and 443; *.example.com: its subdomains',
      collect,
      [],
    )
    .option('--deny <host[:port]>', 'never reach this host, even if allowed (repeatable)', collect, [])
    .option(
      '--secret <NAME=SOURCE@HOSTS>',
      'a credential used without being seen (repeatable); SOURCE: env:VAR, file:/abs/path or cmd:PROGRAM ARGS',
      collect,
      [],
    )
    .option('--policy <file>', 'egress policy YAML (network:, secrets:); --allow/--deny/--secret add to it')
    .option('-i, --stdin', "forward airlock's stdin to the command (default: /dev/null)")
    .option('--json', 'print the ExecResult as JSON on stdout instead of streaming')
    .passThroughOptions()
    .addHelpText('after', RUN_HELP)
    .action(async (cmd: string[], flags: RunFlags) =>
      setStatus(await (await runCli()).runCommand(cmd, flags, io)),
    );
  registerDiffCommand(program, io, setStatus);
  if (oneShot) return program;
  program
    .command('run-code')
    .description('run code once in a fresh sandbox (static analysis first); print output and results')
    .argument('[CODE]', 'the code (or --file)')
    .addOption(
      new Option('--language <L>', 'default python').choices(['python', 'javascript', 'typescript', 'bash']),
    )
    .option('--file <F>', 'read the code from F (- for stdin)')
    .addOption(new Option('--backend <name>', 'isolation tier').choices(CLI_BACKENDS))
    .option('--timeout <seconds>', 'kill the run after this long (default 60)')
    .action(async (code: string | undefined, flags: import('./run-code.js').RunCodeFlags) =>
      setStatus(await (await import('./run-code.js')).runCodeCommand(code, flags, io)),
    );

  const sandboxFlags = (c: Command): Command =>
    c
      .addOption(new Option('--backend <name>', 'isolation tier').choices(CLI_BACKENDS))
      .option('--memory <size>', 'memory limit, e.g. 256m (default 512m)')
      .option('--cpus <n>', 'CPU limit (default 1)')
      .option('--pids <n>', 'max processes/threads (default 256)')
      .option('--disk <size>', 'writable disk size (default 512m)')
      .option('--ttl <duration>', 'server sandbox lifetime (default 24h, renewed by every call)')
      .option('--workspace <dir[:cow|ro]>', "host dir as the server's /workspace: cow (default) or ro")
      .option('-e, --env <NAME=VALUE>', 'environment variable for the server (repeatable)', collect, [])
      .option('--allow <host[:port]>', 'let the server reach this host (repeatable)', collect, [])
      .option('--deny <host[:port]>', 'never reach this host (repeatable)', collect, [])
      .option(
        '--secret <NAME=SOURCE@HOSTS>',
        'a credential the server uses without seeing it (repeatable)',
        collect,
        [],
      )
      .option(
        '--policy <file>',
        'MCP policy YAML/JSON: network, secrets, tools, budgets, scan, output, limits',
      )
      .option('--image <REF>', "run the server on this image's root (its uvx/npx/python)")
      .option('--name <name>', 'server name in the lockfile and logs (default: from the command)')
      .option('--lockfile <file>', 'pinned definitions (default ./airlock.lock.json)')
      .passThroughOptions();
  const mcp = sandboxFlags(
    program
      .command('mcp')
      .description('run one stdio MCP server in a sandbox, mediated; speaks MCP on stdin/stdout')
      .usage('[flags] -- CMD [ARGS...]   |   mcp scan|pin|diff [flags] -- CMD [ARGS...]')
      .argument('[CMD...]', 'the server command, e.g. npx -y @modelcontextprotocol/server-memory'),
  )
    .option('--audit-log <file>', 'append every audit event as a JSON line')
    .addHelpText('after', MCP_HELP)
    .action(async (cmd: string[], flags: McpFlags) =>
      setStatus(await (await mcpCli()).mcpServeCommand(cmd, flags, io)),
    );
  sandboxFlags(
    mcp
      .command('scan')
      .description("print the description scanner's findings (exit 1 on high)")
      .argument('<CMD...>'),
  )
    .option('--json', 'machine-readable report')
    .action(async (cmd: string[], flags: McpFlags) =>
      setStatus(await (await mcpCli()).mcpScanCommand(cmd, flags, io)),
    );
  sandboxFlags(
    mcp.command('pin').description("pin the server's definitions in the lockfile").argument('<CMD...>'),
  ).action(async (cmd: string[], flags: McpFlags) =>
    setStatus(await (await mcpCli()).mcpPinCommand(cmd, flags, io)),
  );
  sandboxFlags(
    mcp
      .command('diff')
      .description('show how the definitions differ from the lockfile (exit 1 if they do)')
      .argument('<CMD...>'),
  ).action(async (cmd: string[], flags: McpFlags) =>
    setStatus(await (await mcpCli()).mcpDiffCommand(cmd, flags, io)),
  );
  program
    .command('gateway')
    .description('serve many sandboxed MCP servers behind one Streamable HTTP (or stdio) endpoint')
    .requiredOption(
      '--config <file>',
      'mcpServers JSON (Claude Desktop / Cursor format) with optional airlock blocks',
    )
    .option('--listen <host:port>', 'override airlock.listen (loopback unless the config allows otherwise)')
    .option('--stdio', 'serve one client on stdin/stdout instead of HTTP')
    .option('--audit-log <file>', 'append every audit event as a JSON line')
    .action(async (flags: GatewayFlags) => setStatus(await (await mcpCli()).gatewayCommand(flags, io)));
  const snapshot = program
    .command('snapshot')
    .description('list and remove snapshots (taken with sbx.snapshot() in the library)');
  snapshot
    .command('ls')
    .description('list the snapshots in the state dir')
    .option('--json', 'machine-readable list')
    .action(async (opts: { json?: boolean }) =>
      setStatus(await (await snapshotCli()).snapshotListCommand(opts, io)),
    );
  snapshot
    .command('rm')
    .description('delete a snapshot and free its disk (refused while a live fork uses it)')
    .argument('<ID>', 'snapshot id (sha256:…), or a unique prefix of its hex digits')
    .action(async (id: string) => setStatus(await (await snapshotCli()).snapshotRemoveCommand(id, io)));
  const image = program
    .command('image')
    .description('pull, load, list and remove OCI images (verified by digest, unpacked into the state dir)');
  image
    .command('ls')
    .description('list the images in the state dir')
    .option('--json', 'machine-readable list')
    .action(async (opts: { json?: boolean }) =>
      setStatus(await (await imageCli()).imageListCommand(opts, io)),
    );
  image
    .command('pull')
    .description(
      'pull an image from its registry (always asks the registry; cached layers are not fetched again)',
    )
    .argument('<REF>', 'host[:port]/path:tag or …@sha256:<hex> (see docs/images.md)')
    .option('--json', 'print the resolved image as JSON')
    .action(async (ref: string, opts: { json?: boolean }) =>
      setStatus(await (await imageCli()).imagePullCommand(ref, opts, io)),
    );
  image
    .command('load')
    .description('load images from an OCI layout directory or a docker save tarball')
    .argument('<PATH>', 'OCI layout dir (index.json, blobs/) or docker save .tar')
    .option('--name <REF>', 'record the image under this reference (required when the source names none)')
    .option('--json', 'print the loaded images as JSON')
    .action(async (path: string, opts: { json?: boolean; name?: string }) =>
      setStatus(await (await imageCli()).imageLoadCommand(path, opts, io)),
    );
  image
    .command('rm')
    .description(
      'remove an image reference and free the layers nothing else needs (never one a live sandbox uses)',
    )
    .argument('<REF>', 'the reference as listed by image ls')
    .option('--json', 'print what was removed as JSON')
    .action(async (ref: string, opts: { json?: boolean }) =>
      setStatus(await (await imageCli()).imageRemoveCommand(ref, opts, io)),
    );
  image
    .command('prune')
    .description('free layers and blobs no image reference needs (never one a live sandbox uses)')
    .option('--json', 'print what was freed as JSON')
    .action(async (opts: { json?: boolean }) =>
      setStatus(await (await imageCli()).imagePruneCommand(opts, io)),
    );
  const template = program
    .command('template')
    .description('build, list, inspect and remove templates (immutable layers sandboxes start from)');
  template
    .command('build')
    .description('build a template from a YAML file, or a Dockerfile with -f')
    .argument('[FILE]', 'template YAML file')
    .option('-f, --file <Dockerfile>', 'build from this Dockerfile (its dir is the build context)')
    .option('--name <name>', "the template's name with -f (default: the context dir's name)")
    .addOption(
      new Option(
        '--backend <name>',
        "tier the steps run on (default: the base's tier, namespaces for the host base)",
      ).choices(CLI_BACKENDS),
    )
    .option('--json', 'print the built template as JSON')
    .action(
      async (
        file: string | undefined,
        opts: { json?: boolean; backend?: string; file?: string; name?: string },
      ) => setStatus(await (await templateCli()).templateBuildCommand(file, opts, io)),
    );
  template
    .command('ls')
    .description('list the templates in the state dir')
    .option('--json', 'machine-readable list')
    .action(async (opts: { json?: boolean }) =>
      setStatus(await (await templateCli()).templateListCommand(opts, io)),
    );
  template
    .command('inspect')
    .description('print a template record as JSON')
    .argument('<NAME|DIGEST>', 'template name, or its digest (sha256:…)')
    .action(async (ref: string) => setStatus(await (await templateCli()).templateInspectCommand(ref, io)));
  template
    .command('rm')
    .description("delete a template's name and the layers it built (refused while a sandbox uses them)")
    .argument('<NAME>', 'template name')
    .action(async (name: string) => setStatus(await (await templateCli()).templateRemoveCommand(name, io)));
  program
    .command('doctor')
    .description('report which isolation tiers and kernel controls work on this host')
    .option('--json', 'machine-readable report')
    .addHelpText('after', '\nExit status: 0 if the namespaces tier can run sandboxes here, 4 otherwise.\n')
    .action(async (opts: { json?: boolean }) => setStatus(await (await doctorCli()).doctorCommand(opts, io)));

  program
    .command('demo')
    .description('run a hostile script in a small sandbox and show what is blocked')
    .addHelpText(
      'after',
      '\nExit status: 0 if every hostile attempt was blocked and the ordinary steps worked, 1 otherwise.\n',
    )
    .action(async () => setStatus(await (await demoCli()).demoCommand(io)));

  registerServerCommands(program, io, setStatus);
  program
    .command('mcp-server')
    .description('serve Airlock itself as an MCP server (sandbox, exec, run_code and file tools)')
    .option('--http <host:port>', 'Streamable HTTP on loopback (token: AIRLOCK_MCP_TOKEN) instead of stdio')
    .addOption(new Option('--backend <name>', 'default isolation tier').choices(CLI_BACKENDS))
    .option('--ttl <duration>', 'default sandbox lifetime (default 10m)')
    .option('--max-sandboxes <n>', 'live sandboxes per session (default 4)')
    .action(async (flags: import('./mcp-server.js').McpServerFlags) =>
      setStatus(await (await mcpServerCli()).mcpServerCommand(flags, io)),
    );
  registerRemoteCommands(program, io, setStatus);
  return program;
}

/** `airlock serve`, the hidden `airlock supervisor`, and `airlock keys` (issue 36; docs/server.md). */
function registerServerCommands(program: Command, io: Io, setStatus: (code: number) => void): void {
  program
    .command('serve')
    .description('run the sandbox server: the native REST API with API keys, tenants and quotas')
    .option('--listen <host:port>', 'address to listen on (default 127.0.0.1:7070; non-loopback needs TLS)')
    .option('--config <file>', 'server config, YAML or JSON (quotas, tenants, limits; see docs/server.md)')
    .option('--state-dir <dir>', 'host state (default AIRLOCK_STATE_DIR or /var/lib/airlock)')
    .option('--tls-cert <file>', 'PEM certificate: serve HTTPS')
    .option('--tls-key <file>', 'PEM private key of --tls-cert')
    .option('--insecure-listen', 'allow a non-loopback --listen without TLS (behind a TLS proxy only)')
    .option('--mcp-config <file>', 'serve the MCP gateway at /mcp: an mcpServers file (as airlock gateway)')
    .option(
      '--first-key',
      'create a first API key (tenant "default") if there is none, and print how to use it',
    )
    .action(async (flags: import('./serve.js').ServeFlags) =>
      setStatus(await (await serveCli()).serveCommand(flags, io)),
    );
  program
    .command('supervisor', { hidden: true })
    .description('the per-state-dir process that owns the sandboxes (started by airlock serve)')
    .option('--state-dir <dir>', 'host state (default AIRLOCK_STATE_DIR or /var/lib/airlock)')
    .action(async (flags: { stateDir?: string }) =>
      setStatus(await (await serveCli()).supervisorCommand(flags, io)),
    );
  const keys = program.command('keys').description("manage the server's API keys (each belongs to a tenant)");
  keys
    .command('create')
    .description('create an API key for a tenant and print it (only this once)')
    .requiredOption(
      '--tenant <name>',
      'the tenant the key acts for, created if new: 1 to 63 lowercase letters, digits, ".", "_" or "-", starting with a letter or digit',
    )
    .option('--state-dir <dir>', 'host state (default AIRLOCK_STATE_DIR or /var/lib/airlock)')
    .option('--json', 'print {id, tenant, key} as JSON')
    .action(async (flags: { tenant: string; stateDir?: string; json?: boolean }) =>
      setStatus((await keysCli()).keysCreateCommand(flags, io)),
    );
  keys
    .command('list')
    .description('list API keys (ids and tenants; never the keys)')
    .option('--state-dir <dir>', 'host state (default AIRLOCK_STATE_DIR or /var/lib/airlock)')
    .option('--json', 'machine-readable list')
    .action(async (flags: { stateDir?: string; json?: boolean }) =>
      setStatus((await keysCli()).keysListCommand(flags, io)),
    );
  keys
    .command('revoke')
    .description('revoke an API key by id: it is refused (401) from the next request on')
    .argument('<ID>', 'key id (airlock keys list)')
    .option('--state-dir <dir>', 'host state (default AIRLOCK_STATE_DIR or /var/lib/airlock)')
    .action(async (id: string, flags: { stateDir?: string }) =>
      setStatus((await keysCli()).keysRevokeCommand(id, flags, io)),
    );
}

/** One line for stderr: what went wrong, which flag or field, and how to fix it. */
async function errorLine(e: unknown, command?: string): Promise<string> {
  if (e instanceof CommanderError) {
    const msg = e.message.replace(/^error:\s*/, '').replace(/\.$/, '');
    return `airlock: ${msg}; see airlock ${command ? `${command} ` : ''}--help`;
  }
  if (AirlockError.isInstance(e)) {
    let msg = e.message;
    const flag = e.field === undefined ? undefined : (await import('./flags.js')).flagForField(e.field);
    if (flag && !msg.startsWith(flag)) msg = `${flag}: ${msg}`;
    else if (e.field && !msg.includes(e.field)) msg = `${e.field}: ${msg}`;
    if (e.code === 'BACKEND_UNAVAILABLE' || e.code === 'PERMISSION_DENIED')
      msg += '; run "airlock doctor" for details';
    return `airlock: ${msg}`;
  }
  const err = e instanceof Error ? e : new Error(String(e));
  return `airlock: internal error: ${err.message}${process.env.AIRLOCK_DEBUG ? `\n${err.stack}` : ' (set AIRLOCK_DEBUG=1 for a stack trace)'}`;
}

function commanderExitCode(e: CommanderError): number {
  // --help and --version exit 0; every usage error (unknown option, missing CMD, bad choice) is a bad flag.
  if (e.code === 'commander.helpDisplayed' || e.code === 'commander.version') return 0;
  return ERROR_CODES.INVALID_ARGUMENT.exit;
}

/** Runs the command line `argv` (without node and the script); resolves to the exit status. */
export async function main(argv: readonly string[], io: Io = processIo): Promise<number> {
  let status = 0;
  const oneShot = ONE_SHOT.includes(argv[0] ?? '');
  if (oneShot) (await import('./one-shot.js')).tuneForOneShot();
  const program = buildProgram(io, (code) => (status = code), oneShot);
  phase('program');
  try {
    await program.parseAsync([...argv], { from: 'user' });
    return status;
  } catch (e) {
    if (e instanceof CommanderError) {
      const code = commanderExitCode(e);
      const command = program.commands.find((c) => c.name() === argv[0])?.name();
      if (code !== 0 && e.code !== 'commander.help') io.err(`${await errorLine(e, command)}\n`);
      return code;
    }
    io.err(`${await errorLine(e)}\n`);
    return exitCodeFor(e);
  }
}

/** Runs the command line of this process and sets its exit status (bin/airlock.cjs calls it). */
export async function runAsProcess(): Promise<void> {
  // A closed stdout/stderr (EPIPE) must not crash airlock mid-cleanup; commands that own a sandbox
  // react to it themselves (lifecycle.ts), everything else just stops writing.
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => {});
  // Set the status and let Node exit once stdout has drained (process.exit could cut piped output).
  const argv = process.argv.slice(2);
  process.exitCode = await main(argv);
  const phases = phaseLine();
  if (phases) processIo.err(`${phases}\n`);
  // A one-shot (run, diff) has killed its sandbox and released its host state by now (runPlan);
  // what is left of a natural exit is Node freeing its heap page by page (issue 31: ~10 ms of
  // munmap on the 2-core reference host), which the OS does at once. So: exit as soon as
  // everything written to stdout/stderr has been handed to the kernel. 'exit' handlers still run.
  if (ONE_SHOT.includes(argv[0] ?? '')) {
    await Promise.all([process.stdout, process.stderr].map(flushed));
    process.exit();
  }
}

/** Resolves once everything written to `stream` so far is written out (or the stream is gone). */
function flushed(stream: NodeJS.WriteStream): Promise<void> {
  if (stream.destroyed || !stream.writable) return Promise.resolve();
  // Writes complete in order: the callback of an empty write runs after every earlier one.
  return new Promise((resolve) => void stream.write('', () => resolve()));
}

/** True when this file is the program node was started with (`node main.js`, `tsx main.ts`). */
function isEntry(): boolean {
  const script = process.argv[1];
  if (!script) return false;
  try {
    // realpathSync.native: one realpath(3) call, where the JS version lstat()s every component of
    // both paths (measurable in a one-shot `airlock run`'s start-up).
    const self = fileURLToPath(import.meta.url);
    return script === self || realpathSync.native(script) === realpathSync.native(self);
  } catch {
    return false;
  }
}

// Not a top-level await: the CLI bundle is CommonJS (see bin/airlock.cjs), which has none.
if (isEntry()) void runAsProcess();
