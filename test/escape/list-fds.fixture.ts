// Fixture (run by resources.test.ts, not a test): started with an extra inherited fd (250, not
// close-on-exec); prints the fds that a sandboxed shell of the tier AIRLOCK_ESCAPE_BACKEND sees, one
// "fd target" per line. None of Airlock's inherited fds may reach it. test/fixtures/list-fds.ts is
// the same for the default tier only.
import { Airlock } from '../../src/index.js';

const backend = process.env.AIRLOCK_ESCAPE_BACKEND === 'gvisor' ? 'gvisor' : 'namespaces';
const airlock = new Airlock({
  stateDir: process.env.AIRLOCK_STATE_DIR!,
  warmPool: 0,
  uidRange: { first: Number(process.env.AIRLOCK_UID_FIRST), count: Number(process.env.AIRLOCK_UID_COUNT) },
});
try {
  const sbx = await airlock.create({ backend });
  // The fds a plain child inherits (`sleep` opens nothing itself), listed by another process.
  const r = await sbx.exec(['/bin/sh', '-c', 'sleep 5 & p=$!; sleep 0.3; ls -l /proc/$p/fd; kill $p']);
  const lines = r.stdout.split('\n').filter((l) => l.includes(' -> '));
  process.stdout.write(lines.map((l) => l.replace(/^.* (\d+) -> /, '$1 ')).join('\n') + '\n');
} finally {
  await airlock.close();
}
