// The sandbox contract through the remote SDK: a RemoteAirlock talking to a real native-API server
// (nativeRoutes over the library, on loopback). Skipped tests need the server's host by nature.
import { afterAll, beforeAll, describe, it } from 'vitest';
import { RemoteAirlock, type Airlock } from '../../src/index.js';
import { canRunNamespaces, SKIP_REASON } from '../helpers.js';
import { startTestServer, type TestServer } from '../server/remote-support.js';
import { sandboxContract } from './sandbox.contract.js';

const HOST_UID =
  "the host uid a sandbox runs as is the server's detail: the wire view (SandboxView) does not carry it";
const HOST_DIR =
  'host directories never go through a server (the remote SDK refuses them: test/server/remote-sdk.test.ts)';

if (canRunNamespaces) {
  let server: TestServer;
  let remote: RemoteAirlock;
  beforeAll(async () => {
    server = await startTestServer();
    remote = new RemoteAirlock({ apiUrl: server.url });
  });
  afterAll(async () => {
    await remote?.close();
    await server?.close();
  });
  sandboxContract('namespaces', {
    variant: 'through the remote SDK',
    // The suite is written against the library's types; RemoteAirlock offers the same surface.
    airlock: () => remote as unknown as Airlock,
    stateDir: () => server.airlock.stateDir,
    skip: {
      'create with defaults': HOST_UID,
      'ids are unique per sandbox': HOST_UID,
      '8 sandboxes created in parallel are independent': HOST_UID,
      'works on a fresh state dir': "a state dir is the server's own (its operator picks it)",
      "workspace 'cow' sees the host files and keeps its writes": HOST_DIR,
      "workspace 'cow' lets the sandbox edit and delete the host files": HOST_DIR,
      "workspace 'ro' is readable and not writable": HOST_DIR,
      'a host dir and a host file are mounted read-only at their paths': HOST_DIR,
      'a mount defaults to the same path inside the sandbox': HOST_DIR,
      'mounts that would expose host config or cover the sandbox layout are refused': HOST_DIR,
      'an unavailable backend throws BACKEND_UNAVAILABLE':
        "probe() checks the server's host (airlock doctor there); the remote SDK has no probe",
    },
  });
} else {
  describe('sandbox contract: namespaces through the remote SDK', () => {
    it.skip(`the whole suite [skipped: ${SKIP_REASON}]`, () => {});
  });
}
