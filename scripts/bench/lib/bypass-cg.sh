# Shared by the bypass scripts (sourced): a cgroup of their own under the
# cgroup2 mount, ways to run a program inside it, and its removal. The
# caller sets BIN and calls bypass_cg_up NAME.
# shellcheck shell=bash

bypass_cg_up() { # name
  local mount
  mount=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
  [ -n "$mount" ] || { echo "no cgroup2 mount" >&2; exit 1; }
  cg="$mount/splitway-$1-$$"
  mkdir "$cg"
}

# Runs a program inside the cgroup (sockets belong to their creator's).
incg() { sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }
# The same in the background, with $! the program's own pid (sh execs it),
# so that killing $! kills the program and not a subshell.
incg_bg() { sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" & }

# Everything in the cgroup goes, the bypass is disabled, the cgroup removed.
bypass_cg_down() {
  xargs -r kill <"$cg/cgroup.procs" 2>/dev/null
  # (cgroup files report size 0, so read it rather than test -s.)
  for _ in $(seq 50); do [ -z "$(cat "$cg/cgroup.procs" 2>/dev/null)" ] && break; sleep 0.1; done
  "$BIN" bypass disable >/dev/null 2>&1
  rmdir "$cg" 2>/dev/null || echo "$0: $cg still holds processes" >&2
}
