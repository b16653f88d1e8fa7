// Data files a language runtime needs beside its ELF closure, keyed by the runtime's real executable
// name (after symlinks: /usr/bin/python3 -> python3.11 matches `python3.11`). The loader-level closure
// (shared libraries, interpreters) is found by reading ELF headers; this table covers what no header
// names: a standard library read at start-up. Anything else (site-packages, git's helper programs,
// locale data, dlopen'd plugins) is the caller's to list in `extraPaths`. See docs/allowlists.md.

export interface RuntimeData {
  /** The runtime's name, for the manifest. */
  readonly runtime: string;
  /** Absolute dirs (in the source root) to include whole, minus `exclude`; a dir that is absent is skipped. */
  readonly paths: readonly string[];
  /** Names excluded at any depth below each dir: exact names, or `prefix*`. */
  readonly exclude: readonly string[];
}

interface Rule {
  readonly match: RegExp;
  readonly data: (m: RegExpMatchArray) => RuntimeData;
}

const RULES: readonly Rule[] = [
  {
    // CPython: its stdlib (pure modules and lib-dynload's extension modules) under <prefix>/lib/pythonX.Y.
    // The test suite and the static-build config dir (libpython.a, Makefile) are never run by programs.
    match: /^python(\d+\.\d+)$/,
    data: (m) => ({
      runtime: `python${m[1]}`,
      paths: [`/usr/lib/python${m[1]}`, `/usr/local/lib/python${m[1]}`],
      exclude: ['test', 'idle_test', 'config-*', 'site-packages', 'dist-packages'],
    }),
  },
  {
    // Perl: Debian's perl-base holds the core modules (strict, warnings, Exporter, …) that perl-base
    // programs need; the larger perl-modules tree (/usr/share/perl/5.*) goes in extraPaths.
    match: /^perl(5[\d.]*)?$/,
    data: () => ({
      runtime: 'perl',
      paths: ['/usr/lib/x86_64-linux-gnu/perl-base', '/usr/lib/perl-base'],
      exclude: [],
    }),
  },
];

/** The data a runtime with this real executable name needs, or undefined when it is no known runtime. */
export function runtimeDataFor(executableName: string): RuntimeData | undefined {
  for (const r of RULES) {
    const m = executableName.match(r.match);
    if (m) return r.data(m);
  }
  return undefined;
}

/** Whether `name` (one path component) is excluded by a runtime's `exclude` list. */
export function excludedName(name: string, exclude: readonly string[]): boolean {
  return exclude.some((x) => (x.endsWith('*') ? name.startsWith(x.slice(0, -1)) : name === x));
}
