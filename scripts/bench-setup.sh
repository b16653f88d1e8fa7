#!/usr/bin/env bash
# Idempotent extras for `npm run bench` only (run after scripts/setup.sh, as root on Debian 12): the
# prerequisites of the peer benchmarked beside Airlock, Anthropic's sandbox-runtime (`srt`):
# ripgrep, socat and bubblewrap. Installs only what is missing; never needed by Airlock itself.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH_APT_PACKAGES=(ripgrep socat bubblewrap)

missing=()
for p in "${BENCH_APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "bench-setup: need root to install: ${missing[*]} (the sandbox-runtime peer is then reported as not run)" >&2
    exit 0
  fi
  echo "bench-setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # A failed install does not stop the bench: the peer's rows then say what is missing.
  if ! { apt-get update -qq || apt-get update -qq; } ||
    ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "bench-setup: could not install ${missing[*]}; the sandbox-runtime peer will report why it cannot run" >&2
  fi
fi
