# Airlock's shell kernel (src/sandbox/code/kernel.ts starts it inside the sandbox with `bash -c SRC`,
# or `sh -c SRC` where the root has no bash). Each cell is eval'd in this one shell, so variables,
# exports, functions and the working directory persist from one cell to the next.
#
# Protocol: the host writes a header line `<id>`, the cell's lines, then the line `<id>` again (the
# id is random per run, so no line of the cell ends it early). The commands arrive on fd 3; the
# cell's stdin is /dev/null. Cell output is raw on fd 1/2; the run ends with the frame
# \x1e\x1eAL:<id>:{"t":"end","exit":N} on stdout and the line \x1e\x1eAL:<id>:end on stderr.
exec 3<&0 0</dev/null
while IFS= read -r __airlock_id <&3; do
  __airlock_code=''
  while IFS= read -r __airlock_line <&3; do
    [ "$__airlock_line" = "$__airlock_id" ] && break
    __airlock_code="$__airlock_code$__airlock_line
"
  done
  eval "$__airlock_code"
  __airlock_rc=$?
  printf '\036\036AL:%s:{"t":"end","exit":%d}\n' "$__airlock_id" "$__airlock_rc"
  printf '\036\036AL:%s:end\n' "$__airlock_id" >&2
done
