#!/usr/bin/env bash
# Idempotent install of everything Airlock needs on Debian 12 (run as root): system packages via
# apt-get, npm packages via `npm ci`. Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# python3-pytest, -pip, -setuptools: the Python SDK's tests and its `pip install ./python`; make and g++
# build better-sqlite3 (the server's state) against Node's own headers. chromium: the browser tests of
# preview URLs (driven by playwright-core; never a browser downloaded at run time). docker-registry:
# the real OCI registry (Distribution v2) the image tests start on loopback in their own netns;
# busybox-static: the static userland those tests build their images from. python3-matplotlib:
# runCode's figures come back as PNG when the sandbox root has it (the code-execution tests).
APT_PACKAGES=(bubblewrap perl procps iproute2 util-linux findutils coreutils nftables curl python3
  python3-pytest python3-pip python3-setuptools make g++ chromium docker-registry busybox-static
  python3-matplotlib)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# bookworm-backports lives on the same mirror as bookworm: add it (once) from the mirror this
# machine's apt already uses for bookworm. Used by the runsc and QEMU steps below.
ensure_backports_source() {
  list=/etc/apt/sources.list.d/airlock-bookworm-backports.list
  if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    # bookworm-backports lives on the same mirror as bookworm: take the mirror this machine's apt
    # already uses for bookworm (deb822 .sources stanzas first, then one-line .list entries).
    mirror=$(awk 'function flush() { if (ok && uri != "") { print uri; found = 1; exit } ok = 0; uri = "" }
      /^[[:space:]]*$/ { flush(); next }
      $1 == "URIs:" { uri = $2 }
      $1 == "Suites:" { for (i = 2; i <= NF; i++) if ($i == "bookworm") ok = 1 }
      END { if (!found && ok && uri != "") print uri }' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1 || true)
    if [ -z "$mirror" ]; then
      mirror=$(awk '$1 == "deb" { m = ""; for (i = 2; i <= NF; i++) { if ($i ~ /^[a-z+]+:\/\//) m = $i; else if (m != "" && $i == "bookworm") { print m; exit } } }' \
        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | head -n1 || true)
    fi
    if [ -z "$mirror" ]; then
      echo "setup: no apt source for bookworm found to take bookworm-backports from; add one, or install runsc (2024 or later) and qemu-system-x86 (9 or later) yourself" >&2
      exit 1
    fi
    echo "deb $mirror bookworm-backports main" >"$list"
  fi
}

# gVisor: runsc from bookworm-backports (2024). Debian 12's own runsc (2022) cannot list a directory
# on this kernel (statx/getdents fail with EINVAL inside the sandbox, so `ls /` fails) and has no
# systrap platform, only the slower ptrace. Installed only where the system is Debian 12 (bookworm).
runsc_ok() { command -v runsc >/dev/null && runsc --version 2>/dev/null | grep -qE 'version 0\.0~20(2[4-9]|[3-9][0-9])'; }
if ! runsc_ok && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install runsc from bookworm-backports" >&2
    exit 1
  fi
  ensure_backports_source
  echo "setup: apt-get install -t bookworm-backports runsc"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || apt-get update -qq
  apt-get install -y -qq --no-install-recommends -t bookworm-backports runsc >/dev/null
fi

# The microVM tier (src/backends/microvm/, docs/microvm.md): QEMU 10 from bookworm-backports (its
# file migration is what the tier's snapshots will use; 7.2 boots microvm just as well), erofs-utils for
# the guest's root image, gcc + libc6-dev for its static agent (gcc comes with g++ above), and the guest
# kernel: Debian's linux-image-cloud-amd64, downloaded (never installed on the host) and unpacked into
# /var/cache/airlock/microvm/kernel.
if grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
  qemu_ok() { command -v qemu-system-x86_64 >/dev/null && qemu-system-x86_64 --version 2>/dev/null | grep -qE 'version (9|[1-9][0-9])\.'; }
  mvm_missing=()
  for p in erofs-utils libc6-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || mvm_missing+=("$p")
  done
  if ! qemu_ok || ((${#mvm_missing[@]})); then
    if [ "$(id -u)" -ne 0 ]; then
      echo "setup: need root to install qemu-system-x86 (bookworm-backports) ${mvm_missing[*]}" >&2
      exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || apt-get update -qq
    if ((${#mvm_missing[@]})); then
      echo "setup: apt-get install ${mvm_missing[*]}"
      apt-get install -y -qq --no-install-recommends "${mvm_missing[@]}" >/dev/null
    fi
    if ! qemu_ok; then
      ensure_backports_source
      apt-get update -qq || apt-get update -qq
      echo "setup: apt-get install -t bookworm-backports qemu-system-x86"
      apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
    fi
  fi
  mvm_cache=/var/cache/airlock/microvm
  if ! ls "$mvm_cache"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "setup: need root to fetch the microVM guest kernel into $mvm_cache" >&2
      exit 1
    fi
    # linux-image-cloud-amd64 is a metapackage: fetch the versioned image it depends on.
    kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
    if [ -z "$kpkg" ]; then
      echo "setup: cannot resolve linux-image-cloud-amd64 (apt-get update?)" >&2
      exit 1
    fi
    echo "setup: apt-get download $kpkg (microVM guest kernel)"
    dl=$(mktemp -d)
    chmod 0755 "$dl"
    (cd "$dl" && apt-get download -qq "$kpkg" 2>/dev/null)
    mkdir -p "$mvm_cache"
    rm -rf "$mvm_cache/kernel.tmp"
    dpkg-deb -x "$dl"/"$kpkg"_*.deb "$mvm_cache/kernel.tmp"
    chmod -R a+rX "$mvm_cache"
    mv "$mvm_cache/kernel.tmp" "$mvm_cache/kernel"
    rm -rf "$dl"
  fi
fi

# npm ci only when node_modules does not match the lockfile.
stamp=node_modules/.airlock-lock-hash
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi
