// E2B envd access tokens and the API keys that obtained them, against a real `airlock serve` (its real
// supervisor, SQLite store and `airlock keys revoke` through the CLI) with the official `e2b` SDK:
// revoking a key ends the envd access it handed out (every envd route, streams too, and the control
// API); a second key of the same tenant connects and gets a token of its own; another tenant's key
// gets not-found. And a token for sandbox X never opens sandbox Y, in any spelling.
import { AuthenticationError, NotFoundError, Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  canRunNamespaces,
  NO_RESIDUE,
  runCli,
  settledResidue,
  SKIP_REASON,
  TEST_STATE_DIR,
} from '../helpers.js';
import { newKey, startServe, stopServe, stopSupervisor, type Served } from './serve-helpers.js';

const accessToken = (sbx: Sandbox): string => (sbx as unknown as { envdAccessToken: string }).envdAccessToken;

/** A Connect-JSON envelope (flags 0, big-endian length, JSON). */
const envelope = (msg: unknown): Buffer => {
  const json = Buffer.from(JSON.stringify(msg));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
};

describe.skipIf(!canRunNamespaces)(`E2B envd tokens and API keys (${SKIP_REASON})`, () => {
  let s: Served;
  let envd: string;
  let a1: { id: string; key: string };
  let a2: { id: string; key: string };
  let b: { id: string; key: string };
  let x: Sandbox; // created with key a1, which is revoked below
  let y: Sandbox; // created with key a2

  beforeAll(async () => {
    await stopSupervisor();
    s = await startServe();
    a1 = newKey('tenant-a');
    a2 = newKey('tenant-a');
    b = newKey('tenant-b');
    process.env.E2B_API_URL = `${s.url}/e2b`;
    process.env.E2B_SANDBOX_URL = envd = `${s.url}/e2b/envd`;
    delete process.env.E2B_API_KEY;
    x = await Sandbox.create({ apiKey: a1.key, timeoutMs: 300_000 });
    y = await Sandbox.create({ apiKey: a2.key, timeoutMs: 300_000 });
  }, 120_000);

  afterAll(async () => {
    await y?.kill().catch(() => {});
    await Sandbox.kill(x?.sandboxId ?? '-', { apiKey: a2?.key }).catch(() => {});
    if (s) expect(await stopServe(s)).toBe(0);
    await stopSupervisor();
    expect(await settledResidue(5000)).toEqual(NO_RESIDUE);
  }, 120_000);

  /** Each envd route family with `token` for sandbox `id`: HTTP status, or the stream's error code. */
  async function envdAnswers(id: string, token: string): Promise<Record<string, number | string>> {
    const h = { 'E2b-Sandbox-Id': id, 'X-Access-Token': token };
    const file = await fetch(`${envd}/files?path=/etc/hostname`, { headers: h });
    await file.arrayBuffer();
    const stat = await fetch(`${envd}/filesystem.Filesystem/Stat`, {
      method: 'POST',
      headers: { ...h, 'content-type': 'application/json' },
      body: JSON.stringify({ path: '/etc' }),
    });
    await stat.arrayBuffer();
    const list = await fetch(`${envd}/process.Process/List`, {
      method: 'POST',
      headers: { ...h, 'content-type': 'application/json' },
      body: '{}',
    });
    await list.arrayBuffer();
    const start = await fetch(`${envd}/process.Process/Start`, {
      method: 'POST',
      headers: { ...h, 'content-type': 'application/connect+json' },
      body: envelope({ process: { cmd: 'true' } }),
    });
    const frames = Buffer.from(await start.arrayBuffer());
    // A stream refused before it starts is one end-stream frame (flags 2) carrying the error.
    const end =
      frames[0] === 2 ? (JSON.parse(frames.subarray(5).toString()) as { error?: { code: string } }) : {};
    return {
      files: file.status,
      stat: stat.status,
      list: list.status,
      start: end.error?.code ?? `frame ${frames[0]}`,
    };
  }

  it('every envd route accepts the token before the revoke (the checks below are not failing for another reason)', async () => {
    expect((await x.commands.run('echo hi')).stdout).toBe('hi\n');
    expect(await envdAnswers(x.sandboxId, accessToken(x))).toEqual({
      files: 200,
      stat: 200,
      list: 200,
      start: 'frame 0',
    });
  }, 60_000);

  it('a token for sandbox X never works for sandbox Y: id swap, tenant swap, key swap, truncation, re-encodings, upper-cased hex', async () => {
    const tx = accessToken(x);
    const [t, k, m] = tx.split('.') as [string, string, string];
    const mac = Buffer.from(m, 'base64url');
    const tenant = Buffer.from(t, 'base64url');
    const variants: Record<string, string> = {
      'tenant swap': `${Buffer.from('tenant-b').toString('base64url')}.${k}.${m}`,
      'key swap': `${t}.${a2.id}.${m}`,
      truncated: tx.slice(0, -1),
      'mac truncated': `${t}.${k}.${m.slice(0, 40)}`,
      'mac as base64': `${t}.${k}.${mac.toString('base64')}`,
      'mac padded': `${t}.${k}.${m}=`,
      'tenant as padded base64': `${tenant.toString('base64')}.${k}.${m}`,
      'tenant padded': `${t}==.${k}.${m}`,
      'key id upper-cased hex': `${t}.${k.toUpperCase()}.${m}`,
      'mac as hex': `${t}.${k}.${mac.toString('hex')}`,
      'mac upper-cased hex': `${t}.${k}.${mac.toString('hex').toUpperCase()}`,
      'extra field': `${tx}.${m}`,
    };
    expect(k).toBe(a1.id); // the token names the key that asked for it
    // Y is the same tenant's (key a2): only the sandbox id differs.
    expect((await envdAnswers(y.sandboxId, tx)).files).toBe(401);
    for (const [what, v] of Object.entries(variants)) {
      expect(v, what).not.toBe(tx);
      expect((await envdAnswers(x.sandboxId, v)).files, `${what} for X`).toBe(401);
      expect((await envdAnswers(y.sandboxId, v)).files, `${what} for Y`).toBe(401);
    }
    // Y's own token for X: the id swap the other way.
    expect((await envdAnswers(x.sandboxId, accessToken(y))).files).toBe(401);
  }, 120_000);

  it('revoking the key (airlock keys revoke) ends its tokens on every envd route and the control API; the SDK says auth error', async () => {
    const r = await runCli(['keys', 'revoke', a1.id, '--state-dir', TEST_STATE_DIR], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(0);
    await expect(x.commands.run('echo hi')).rejects.toBeInstanceOf(AuthenticationError);
    await expect(x.files.read('/etc/hostname')).rejects.toBeInstanceOf(AuthenticationError);
    await expect(x.files.list('/')).rejects.toBeInstanceOf(AuthenticationError);
    expect(await envdAnswers(x.sandboxId, accessToken(x))).toEqual({
      files: 401,
      stat: 401,
      list: 401,
      start: 'unauthenticated',
    });
    // The control API: the key itself is refused.
    await expect(Sandbox.getInfo(x.sandboxId, { apiKey: a1.key })).rejects.toBeInstanceOf(
      AuthenticationError,
    );
    await expect(Sandbox.connect(x.sandboxId, { apiKey: a1.key })).rejects.toBeInstanceOf(
      AuthenticationError,
    );
    await expect(Sandbox.create({ apiKey: a1.key })).rejects.toBeInstanceOf(AuthenticationError);
  }, 60_000);

  it("another key of the same tenant connects, and gets a token bound to itself; the revoked key's stays dead", async () => {
    const again = await Sandbox.connect(x.sandboxId, { apiKey: a2.key });
    expect(accessToken(again)).not.toBe(accessToken(x));
    expect(accessToken(again).split('.')[1]).toBe(a2.id);
    expect((await again.commands.run('echo back')).stdout).toBe('back\n');
    await again.files.write('/tmp/k', 'v');
    expect(await again.files.read('/tmp/k')).toBe('v');
    await expect(x.commands.run('true')).rejects.toBeInstanceOf(AuthenticationError);
  }, 60_000);

  it("streams open when their key is revoked end with an auth error (a command's output, a watch)", async () => {
    const a3 = newKey('tenant-a');
    const sbx = await Sandbox.connect(x.sandboxId, { apiKey: a3.key });
    let out = '';
    let sawOutput!: () => void;
    const printed = new Promise<void>((r) => (sawOutput = r));
    const cmd = await sbx.commands.run('echo started; sleep 120', {
      background: true,
      timeoutMs: 0,
      onStdout: (d) => {
        out += d;
        if (out.includes('started')) sawOutput();
      },
    });
    let watchEnded!: (e: unknown) => void;
    const watchEnd = new Promise<unknown>((r) => (watchEnded = r));
    await sbx.files.makeDir('/tmp/watched');
    const watch = await sbx.files.watchDir('/tmp/watched', () => {}, {
      onExit: (e) => watchEnded(e),
      timeoutMs: 0,
    });
    await printed;
    const r = await runCli(['keys', 'revoke', a3.id, '--state-dir', TEST_STATE_DIR], { timeoutMs: 60_000 });
    expect(r.code, r.stderr).toBe(0);
    await expect(cmd.wait()).rejects.toBeInstanceOf(AuthenticationError);
    expect(await watchEnd).toBeInstanceOf(AuthenticationError);
    await watch.stop();
    // The command itself belongs to the tenant's sandbox and runs on: another key still sees it.
    const again = await Sandbox.connect(x.sandboxId, { apiKey: a2.key });
    expect((await again.commands.list()).some((p) => p.pid === cmd.pid)).toBe(true);
    await again.commands.kill(cmd.pid);
  }, 60_000);

  it("another tenant's key gets not-found, exactly as for an unknown id", async () => {
    const err = await Sandbox.connect(x.sandboxId, { apiKey: b.key }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NotFoundError);
    const unknown = await Sandbox.connect('sbx-0000000000000000', { apiKey: b.key }).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(NotFoundError);
    expect((err as Error).message.replace(x.sandboxId, 'ID')).toBe(
      (unknown as Error).message.replace('sbx-0000000000000000', 'ID'),
    );
    // Nor can it kill it: the same not-found (false), and the sandbox runs on.
    expect(await Sandbox.kill(y.sandboxId, { apiKey: b.key })).toBe(false);
    const del = (id: string): Promise<Response> =>
      fetch(`${s.url}/e2b/sandboxes/${id}`, { method: 'DELETE', headers: { 'X-API-Key': b.key } });
    const [theirs, none] = [await del(y.sandboxId), await del('sbx-0000000000000000')];
    expect([theirs.status, none.status]).toEqual([404, 404]);
    expect((await theirs.text()).replace(y.sandboxId, 'ID')).toBe(
      (await none.text()).replace('sbx-0000000000000000', 'ID'),
    );
    expect((await y.commands.run('echo alive')).stdout).toBe('alive\n');
  }, 60_000);
});
