#!/usr/bin/env bash
# benches/slower.sh FACTOR COMMAND...: run COMMAND on this machine made FACTOR times slower (1 < FACTOR <= 5), every
# core alike: one benches/slower.c per core takes 1 - 1/FACTOR of it at real-time priority, for as long as COMMAND
# runs. For the suite's time on a slower machine kind than the one at hand (docs/development.md): CPU-bound work
# takes FACTOR times as long, sleeps and timeouts do not stretch. An emulation, not that machine: its memory and
# caches are this one's. Linux, as root (or with CAP_SYS_NICE). Exits with COMMAND's status; the spinners stop with
# COMMAND, and with this script however it ends (they die with their parent).
set -euo pipefail
usage="usage: benches/slower.sh FACTOR COMMAND... (FACTOR: how many times slower, above 1 and at most 5)"
[ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
factor=$1
shift
fraction=$(awk -v f="$factor" 'BEGIN { if (f + 0 == f && f > 1 && f <= 5) printf "%.4f", 1 - 1 / f; else exit 1 }') ||
    { echo "benches/slower.sh: FACTOR $factor is not a number above 1 and at most 5" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
bin=$(mktemp -d)
spinners=()
stop() {
    [ ${#spinners[@]} -eq 0 ] || kill "${spinners[@]}" 2>/dev/null || true
    wait "${spinners[@]}" 2>/dev/null || true
    rm -rf "$bin"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
${CC:-cc} -O2 -o "$bin/slower" "$here/slower.c"
# every core this script may run on (its affinity: "0-1", "0,2-3")
cpus=$(taskset -pc $$ | sed 's/.*: //')
for cpu in $(for part in ${cpus//,/ }; do seq "${part%-*}" "${part#*-}"; done); do
    "$bin/slower" "$cpu" "$fraction" $$ &
    spinners+=($!)
done
sleep 0.2
for pid in "${spinners[@]}"; do  # one that could not take its core has said why and exited
    kill -0 "$pid" 2>/dev/null || { echo "benches/slower.sh: a spinner failed (above); not slowed, nothing run" >&2; exit 1; }
done
rc=0
"$@" || rc=$?
exit $rc
