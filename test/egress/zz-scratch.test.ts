import { it } from 'vitest';
import { Airlock } from '../../src/index.js';
import { TEST_UID_RANGE } from '../helpers.js';
import { assertPrivateNetns, guardedDialer, testResolver, startTestServers } from './net.js';
assertPrivateNetns();
it('explore', async () => {
  const servers = await startTestServers();
  const a = new Airlock({ stateDir: '/var/tmp/airlock-egress-test', uidRange: TEST_UID_RANGE, egress: { resolver: testResolver(), dialer: guardedDialer() } });
  const s = await a.create({ network: { allow: ['allowed.test', 'allowed.test:5432'] } });
  for (const c of ['ulimit -n; ulimit -Hn; python3 --version; curl --version | head -3; which python3 perl node; cat /proc/self/limits | grep -i open',
    "printf 'hello\\n' | curl -sS -m 3 --socks5-hostname 127.0.0.1:3128 telnet://allowed.test:5432; echo rc=$?"]) {
    const r = await s.exec(c);
    console.log(c, '\n', r.stdout, r.stderr, JSON.stringify(r.egress));
  }
  await s.kill(); await a.close(); await servers.close();
});
