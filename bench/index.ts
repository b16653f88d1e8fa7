// `npm run bench -- [name] [--runs N]`: runs the named benchmark (or all) and prints a Markdown
// table beside the raw baselines measured in the same run. Results are also written as JSON to
// bench/results/<timestamp>.json. Benchmarks are never part of the test run.
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, release } from 'node:os';
import { egressBench, formatEgress } from './egress.js';
import { forkBench, formatFork } from './fork.js';
import { formatLifecycle, lifecycle } from './lifecycle.js';
import { formatMcp, mcpBench } from './mcp.js';

const BENCHES = {
  lifecycle: async (runs: number, log: (s: string) => void) => {
    const r = await lifecycle({ runs, log });
    return { data: r, text: formatLifecycle(r) };
  },
  egress: async (_runs: number, log: (s: string) => void) => {
    const r = await egressBench({ log });
    return { data: r, text: formatEgress(r) };
  },
  fork: async (runs: number, log: (s: string) => void) => {
    const r = await forkBench({ runs, log });
    return { data: r, text: formatFork(r) };
  },
  mcp: async (_runs: number, log: (s: string) => void) => {
    const r = await mcpBench({ log });
    return { data: r, text: formatMcp(r) };
  },
} as const;

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const runsIdx = args.indexOf('--runs');
  const runs = runsIdx >= 0 ? Number(args[runsIdx + 1]) : 300;
  const names = args.filter((a, i) => !a.startsWith('--') && args[i - 1] !== '--runs');
  const selected = names.length ? names : Object.keys(BENCHES);
  const log = (s: string): void => void process.stderr.write(`bench: ${s}\n`);
  const header = `machine: ${cpus().length} cores (${cpus()[0]?.model ?? '?'}), kernel ${release()}, node ${process.version}`;
  console.log(header + '\n');
  const results: Record<string, unknown> = {};
  for (const name of selected) {
    const b = BENCHES[name as keyof typeof BENCHES];
    if (!b) {
      console.error(`bench: unknown benchmark "${name}"; choose from ${Object.keys(BENCHES).join(', ')}`);
      process.exit(2);
    }
    const { data, text } = await b(runs, log);
    results[name] = data;
    console.log(`## ${name}\n\n${text}\n`);
  }
  mkdirSync('bench/results', { recursive: true });
  const file = `bench/results/${new Date().toISOString().replace(/[:.]/g, '-')}.json`;
  writeFileSync(file, JSON.stringify({ header, results }, null, 2));
  log(`wrote ${file}`);
}

await main();
