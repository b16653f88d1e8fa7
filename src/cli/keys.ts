// `airlock keys create --tenant T | list | revoke ID`: API keys of `airlock serve`, in its SQLite
// store (<state dir>/server.db). A key is printed once, at creation; only its sha256 is stored.
import { join } from 'node:path';
import { Store } from '../server/store.js';
import type { Io } from './defaults.js';
import { stateDirOf } from './serve.js';
import { table } from './table.js';

interface KeysFlags {
  stateDir?: string;
  json?: boolean;
}

function withStore<T>(flags: KeysFlags, f: (s: Store) => T): T {
  const store = new Store(join(stateDirOf(flags.stateDir), 'server.db'));
  try {
    return f(store);
  } finally {
    store.close();
  }
}

export function keysCreateCommand(flags: KeysFlags & { tenant: string }, io: Io): number {
  const { id, key } = withStore(flags, (s) => s.createKey(flags.tenant));
  if (flags.json) io.out(`${JSON.stringify({ id, tenant: flags.tenant, key })}\n`);
  else {
    io.out(`${key}\n`);
    io.err(`airlock: key ${id} for tenant "${flags.tenant}"; it is shown only now: store it safely\n`);
  }
  return 0;
}

export function keysListCommand(flags: KeysFlags, io: Io): number {
  const keys = withStore(flags, (s) => s.listKeys());
  if (flags.json) io.out(`${JSON.stringify(keys)}\n`);
  else
    io.out(
      table([
        ['ID', 'TENANT', 'CREATED', 'REVOKED'],
        ...keys.map((k) => [k.id, k.tenant, k.created, k.revoked ?? '-']),
      ]),
    );
  return 0;
}

export function keysRevokeCommand(id: string, flags: KeysFlags, io: Io): number {
  const k = withStore(flags, (s) => s.revokeKey(id));
  io.out(`revoked ${k.id} (tenant "${k.tenant}")\n`);
  return 0;
}
