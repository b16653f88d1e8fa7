// `airlock snapshot ls [--json]` and `airlock snapshot rm ID`: the snapshots stored in this state dir
// (AIRLOCK_STATE_DIR). Snapshots are taken and forked through the library (sbx.snapshot(), snap.fork()).
import { AirlockError } from '../core/errors.js';
import { formatBytes } from '../core/units.js';
import type { Snapshot } from '../sandbox/airlock.js';
import { cliAirlock } from './lifecycle.js';
import { processIo, type Io } from './run.js';
import { table } from './table.js';

/** A full id, or a unique prefix of its hex digits (at least 4), with or without "sha256:". */
async function resolveId(all: readonly Snapshot[], id: string): Promise<Snapshot> {
  const hex = id.startsWith('sha256:') ? id.slice(7) : id;
  if (!/^[0-9a-f]{4,64}$/.test(hex)) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `"${id}" is not a snapshot id: give sha256:<64 hex> or at least 4 of its hex digits`,
      { field: 'id' },
    );
  }
  const matches = all.filter((s) => s.id.slice(7).startsWith(hex));
  if (matches.length === 0)
    throw new AirlockError('SNAPSHOT_NOT_FOUND', `no snapshot ${id}`, { field: 'id' });
  if (matches.length > 1) {
    throw new AirlockError(
      'INVALID_ARGUMENT',
      `"${id}" matches ${matches.length} snapshots (${matches.map((s) => short(s.id)).join(', ')}); give more digits`,
      { field: 'id' },
    );
  }
  return matches[0]!;
}

const short = (id: string): string => id.slice(0, 19); // sha256: + 12 hex

function parentText(s: Snapshot): string {
  if (s.parent.layers.length) return short(s.parent.layers[0]!);
  const ws = s.parent.workspace;
  return ws.hostDir ? `${ws.hostDir} (${ws.mode})` : '-';
}

export async function snapshotListCommand(opts: { json?: boolean }, io: Io = processIo): Promise<number> {
  const airlock = cliAirlock();
  const snaps = await airlock.snapshots.list();
  const users = await Promise.all(snaps.map((s) => s.users()));
  if (opts.json) {
    io.out(
      JSON.stringify(
        snaps.map((s, i) => ({ ...s.toJSON(), users: users[i] })),
        null,
        2,
      ) + '\n',
    );
    return 0;
  }
  if (snaps.length === 0) {
    io.out(`no snapshots in ${airlock.stateDir}\n`);
    return 0;
  }
  const rows = [['ID', 'CREATED', 'SIZE', 'DISK', 'ENTRIES', 'PARENT', 'FORKS']];
  snaps.forEach((s, i) =>
    rows.push([
      short(s.id),
      s.createdAt
        .toISOString()
        .replace('T', ' ')
        .replace(/\.\d+Z$/, 'Z'),
      formatBytes(s.sizeBytes),
      formatBytes(s.diskBytes),
      String(s.entries),
      parentText(s),
      String(users[i]!.length),
    ]),
  );
  io.out(table(rows));
  return 0;
}

export async function snapshotRemoveCommand(id: string, io: Io = processIo): Promise<number> {
  const airlock = cliAirlock();
  const snap = await resolveId(await airlock.snapshots.list(), id);
  await snap.remove();
  io.out(`removed ${snap.id}\n`);
  return 0;
}
