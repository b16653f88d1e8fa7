// The egress-protocol suite (protocol.contract.ts) against every egress path: the HTTP proxy,
// CONNECT, SOCKS5 and transparent interception, in one world and one sandbox.
import { afterAll, beforeAll } from 'vitest';
import type { Sandbox } from '../../src/index.js';
import { canRunNamespaces } from '../helpers.js';
import { startEgressWorld, type EgressWorld } from './harness.js';
import { assertPrivateNetns } from './net.js';
import { EGRESS_PATHS, egressProtocolSuite, SUITE_SECRET, SUITE_SPEC } from './protocol.contract.js';

assertPrivateNetns();

let world: EgressWorld;
let sandbox: Sandbox;

beforeAll(async () => {
  if (!canRunNamespaces) return;
  world = await startEgressWorld({ secretEnv: { [SUITE_SECRET.name]: SUITE_SECRET.value } });
  sandbox = await world.airlock.create(SUITE_SPEC);
});

afterAll(async () => {
  await sandbox?.kill();
  await world?.close();
});

for (const path of EGRESS_PATHS) egressProtocolSuite(path, () => ({ world, sandbox }));
