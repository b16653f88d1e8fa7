// The WASM tier beside the namespaces tier, measured in the same run (issue 34 part 3). Prints
// medians; not wired into bench/index.ts. Rows:
//  - wasm runCode on a live sandbox, one-shot context: python `1 + 1`, javascript `1 + 1`;
//  - wasm one-shot: create (warm worker ready) → runCode python → destroy;
//  - wasm cold create (no warm worker: Pyodide and QuickJS load);
//  - namespaces exec on a live sandbox: `python3 -c 1`, `node -e 1`;
//  - namespaces one-shot: create → exec `python3 -c 1` → kill.
// The wasm rows call the tier's backend directly (sbx.runCode delegates to that same hook).
// Run: npx tsx bench/wasm.ts [--quick]
import { silentLogger } from '../src/core/backend.js';
import { parseSandboxSpec } from '../src/core/spec.js';
import { WasmBackend } from '../src/backends/wasm/index.js';
import { Airlock, Sandbox } from '../src/index.js';
import { BENCH_STATE_DIR, BENCH_UID_RANGE } from './common.js';
import { fmt, sample, summarize } from './stats.js';

const quick = process.argv.includes('--quick');
const N = quick ? 5 : 20;
const N_ONESHOT = quick ? 3 : 8;

async function main(): Promise<void> {
  const rows: Array<[string, number]> = [];
  const row = (name: string, samples: number[]): void => {
    const s = summarize(samples);
    rows.push([name, s.p50]);
    process.stdout.write(`${name.padEnd(48)} p50 ${fmt(s.p50)}  (n=${s.n}, min ${fmt(s.min)})\n`);
  };
  const spec = parseSandboxSpec({ backend: 'wasm' });

  // ---- wasm ----
  const backend = new WasmBackend({ stateDir: BENCH_STATE_DIR, logger: silentLogger });
  const live = await backend.create(spec);
  const code = (language: 'python' | 'javascript') => async () => {
    const r = await live.runCode!({ code: '1 + 1', language, timeoutMs: 60_000, envs: {} });
    if (r.results[0]?.text !== '2') throw new Error(`unexpected result ${JSON.stringify(r)}`);
  };
  row('wasm runCode python (live sandbox)', await sample(N, code('python'), 3));
  row('wasm runCode javascript (live sandbox)', await sample(N, code('javascript'), 3));
  await live.destroy();
  const oneShot: number[] = [];
  for (let i = 0; i < N_ONESHOT; i++) {
    backend.prepare({ network: 'none', snapshotForks: false });
    await backend.whenWarm(); // the warm worker has loaded: measure what a create costs then
    const t0 = performance.now();
    const s = await backend.create(spec);
    await s.runCode!({ code: '1 + 1', language: 'python', timeoutMs: 60_000, envs: {} });
    await s.destroy();
    oneShot.push(performance.now() - t0);
  }
  row('wasm one-shot create+runCode+destroy (warm)', oneShot);
  await backend.close();
  const cold = new WasmBackend({ stateDir: BENCH_STATE_DIR, logger: silentLogger }, { warmPool: 0 });
  const coldSamples: number[] = [];
  for (let i = 0; i < Math.min(3, N_ONESHOT); i++) {
    const t0 = performance.now();
    const s = await cold.create(spec);
    await s.runCode!({ code: '1 + 1', language: 'python', timeoutMs: 60_000, envs: {} });
    await s.destroy();
    coldSamples.push(performance.now() - t0);
  }
  row('wasm one-shot create+runCode+destroy (cold)', coldSamples);
  await cold.close();

  // ---- namespaces, same run ----
  const airlock = new Airlock({ stateDir: BENCH_STATE_DIR, uidRange: BENCH_UID_RANGE });
  try {
    const sbx = await Sandbox.create({ backend: 'namespaces' }, { airlock });
    const exec = (argv: string[]) => async () => {
      const r = await sbx.exec(argv);
      if (r.exitCode !== 0) throw new Error(`${argv.join(' ')}: exit ${r.exitCode}: ${r.stderr}`);
    };
    row('namespaces exec python3 -c 1 (live sandbox)', await sample(N, exec(['python3', '-c', '1']), 3));
    row('namespaces exec node -e 1 (live sandbox)', await sample(N, exec(['node', '-e', '1']), 3));
    await sbx.kill();
    row(
      'namespaces one-shot create+exec python3+kill',
      await sample(
        N_ONESHOT,
        async () => {
          const s = await Sandbox.create({ backend: 'namespaces' }, { airlock });
          await s.exec(['python3', '-c', '1']);
          await s.kill();
        },
        2,
      ),
    );
  } finally {
    await airlock.killAll();
    await airlock.close();
  }
}

await main();
