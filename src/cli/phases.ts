// Start-up phase timestamps of one CLI run (issue 31): with AIRLOCK_CLI_PHASES=1, airlock prints on
// stderr, as it exits, when each phase ended, in ms since the process started (so node's own start
// is the first figure). Nothing is recorded or printed otherwise. bin/airlock.cjs records the
// bundle's load in the same list (the global below), before this module exists.
//   AIRLOCK_CLI_PHASES=1 airlock run -- true
// Times come from process.uptime() (the clock node started at), not `performance` (which loads
// perf_hooks, a start-up cost of its own).

/** The list bin/airlock.cjs and this module share: [phase, ms since the process started]. */
const KEY = Symbol.for('airlock.cli.phases');
type Marks = Array<[string, number]>;

function marks(): Marks | undefined {
  const g = globalThis as { [KEY]?: Marks };
  if (g[KEY] === undefined && process.env.AIRLOCK_CLI_PHASES === '1') g[KEY] = [];
  return g[KEY];
}

/** Records that `name` has just ended (a no-op unless AIRLOCK_CLI_PHASES=1). */
export function phase(name: string): void {
  marks()?.push([name, process.uptime() * 1000]);
}

/** The recorded phases as one line, e.g. "airlock phases (ms): bundle 60.1 (+60.1), …"; undefined if off. */
export function phaseLine(): string | undefined {
  const m = marks();
  if (!m?.length) return undefined;
  let last = 0;
  const parts = m.map(([name, at]) => {
    const s = `${name} ${at.toFixed(1)} (+${(at - last).toFixed(1)})`;
    last = at;
    return s;
  });
  return `airlock phases (ms since the process started): ${parts.join(', ')}`;
}
