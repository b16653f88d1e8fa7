#!/bin/bash
# The microVM tier's guest userland, copied from the host's installed Debian packages (until images,
# issue 32, provide the rootfs). Two modes:
#   rootfs-packages.sh list PKG...      print "package version" of PKG and their installed dependency
#                                       closure (Pre-Depends + Depends), sorted: the build's cache key
#   rootfs-packages.sh build DIR PKG... copy the closure's files (no docs, man pages or locales) into
#                                       DIR, merged-/usr style (bin, sbin, lib, lib64 link into usr/)
# Only installed packages are taken; an alternative (a | b) resolves to its first installed member.
set -euo pipefail
export LC_ALL=C

closure() {
  declare -A seen=()
  local queue=("$@") p deps alt a name
  while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n ${seen[$p]:-} ]] && continue
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) == installed ]] || continue
    seen[$p]=1
    deps=$(dpkg-query -W -f='${Pre-Depends}, ${Depends}' "$p")
    IFS=',' read -ra alts <<<"$deps"
    for alt in "${alts[@]}"; do
      IFS='|' read -ra as <<<"$alt"
      for a in "${as[@]}"; do
        name=$(sed -E 's/\(.*\)//; s/:any//; s/[[:space:]]//g' <<<"$a")
        [[ -z $name ]] && continue
        if [[ $(dpkg-query -W -f='${db:Status-Status}' "$name" 2>/dev/null || true) == installed ]]; then
          queue+=("$name")
          break
        fi
      done
    done
  done
  for p in "${!seen[@]}"; do echo "$p"; done | sort
}

mode=$1
shift
case $mode in
list)
  closure "$@" | while read -r p; do echo "$p $(dpkg-query -W -f='${Version}' "$p")"; done
  ;;
build)
  dir=$1
  shift
  mkdir -p "$dir/usr/bin" "$dir/usr/sbin" "$dir/usr/lib" "$dir/usr/lib64"
  for l in bin sbin lib lib64; do ln -sfn "usr/$l" "$dir/$l"; done
  # tar follows /bin -> usr/bin on the host when reading, and --keep-directory-symlink keeps DIR's
  # bin -> usr/bin link when writing, so every file lands under usr/ as on the host.
  closure "$@" | xargs dpkg-query -L |
    grep -vE '^/usr/share/(doc|man|info|locale|lintian|bug)(/|$)' | sort -u |
    while read -r f; do if [[ (-e $f || -L $f) && ! (-d $f && ! -L $f) ]]; then echo "${f#/}"; fi; done |
    tar -C / --no-recursion -cf - -T - | tar -C "$dir" --keep-directory-symlink -xf -
  ;;
*)
  echo "usage: $0 list PKG... | build DIR PKG..." >&2
  exit 2
  ;;
esac
