#!/usr/bin/env bash
# The whole test run: install (idempotent), typecheck, lint, format check, every test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
npm run typecheck
npm run lint
npm run format:check
npx vitest run "$@"
scripts/egress-test.sh
