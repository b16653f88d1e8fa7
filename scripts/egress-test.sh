#!/usr/bin/env bash
# Runs the egress tests inside a network namespace made for this run (unshare -n): its only interface
# is lo, with TEST-NET-3 addresses (203.0.113.0/24) added for the test servers. Nothing the tests (or
# a bug in Airlock) do can put a packet on a real network: there is no other interface and no route.
set -euo pipefail
cd "$(dirname "$0")/.."
exec unshare --net -- /bin/sh -c '
  set -e
  ip link set lo up
  for a in 10 11 12 20 30; do ip addr add 203.0.113.$a/32 dev lo; done
  export AIRLOCK_EGRESS_TEST_NETNS=1
  exec npx vitest run --config vitest.egress.config.ts "$@"
' egress-test "$@"
