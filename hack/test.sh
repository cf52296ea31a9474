#!/usr/bin/env bash
# Runs the whole test suite (`make test`): go test -race -v over every package, the full log
# in _output/test.log, and on the terminal one line per test with its time (PASS, FAIL, SKIP
# with its reason) and the package summaries. On failure the log lines before each failed
# test are printed too. Arguments replace the package list (default ./...).
#
# Then every skip is checked against hack/skips.txt (hack/skipcheck): under CI (CI set to
# anything but "", 0 or false; see internal/testenv) a skip that the list does not allow,
# with its package, test name and kind, fails the run, and is printed as UNEXPECTED SKIPS.
# RAID10_TEST_LOG moves the log (skipcheck's own test runs this script on a fixture), and
# RAID10_CPU_LOG the per-package CPU times (hack/cpu-exec.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p _output
# shellcheck source=hack/tool-env.sh
source hack/tool-env.sh
log=${RAID10_TEST_LOG:-_output/test.log}
: >"$log"
# The slowest package is test/cluster (the kubelet story): 13.5 min in a clean-clone CI run,
# 25 to 29 min on a 2-core machine loaded by other VMs; 50 min per package stays well inside
# CI's 90-minute limit for the whole run.
# The slowest packages first: go test starts packages in the order given, two at a time on 2
# cores, so the story and the other VM suites overlap the many short packages instead of
# forming the run's tail (measured in a clean-clone CI run: test/cluster 1,157 s, test/sanity
# 318, cmd/raid10-csi 274, test/e2e 214, test/diskfault 189).
slow_first=(./test/cluster ./test/sanity ./cmd/raid10-csi ./test/e2e ./test/diskfault)
if (($# == 0)); then
  module=$(go list -m)
  mapfile -t rest < <(go list ./... | sed "s#^$module#.#" | grep -vxF -f <(printf '%s\n' "${slow_first[@]}"))
  set -- "${slow_first[@]}" "${rest[@]}"
fi
# cpu_ticks: the machine's busy and total CPU ticks since boot (/proc/stat's first line).
cpu_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }
read -r busy0 total0 < <(cpu_ticks)
# Each package's test binary runs under hack/cpu-exec.sh, which records its CPU time and that
# of the processes it waited for (QEMU, API servers): the table at the end (issue 24).
export RAID10_CPU_LOG=${RAID10_CPU_LOG:-$PWD/_output/cpu.txt} RAID10_ROOT=$PWD
: >"$RAID10_CPU_LOG"
# The compiles run with GOGC=400 (RAID10_BUILD_GOGC): about 16% less CPU than the default
# (see .ci/run); the test binaries get the caller's GOGC back from hack/cpu-exec.sh.
export RAID10_TEST_GOGC=${GOGC-}
GOGC=${RAID10_BUILD_GOGC:-400} go test -race -count=1 -timeout 50m -exec "$PWD/hack/cpu-exec.sh" -v "$@" >"$log" 2>&1 &
pid=$!
tail -n +1 -f --pid="$pid" "$log" | awk '
  /^[ \t]*--- SKIP/ { print; if (prev ~ /^[ \t]+[^ \t]+\.go:[0-9]+:/) print "      " prev; fflush(); }
  /^[ \t]*--- (PASS|FAIL)/ || /^(ok|FAIL|panic:)[ \t]/ || /^\?[ \t]/ { print; fflush(); }
  { prev = $0 }'
wait "$pid"
rc=$?
# How much of the machine the run kept busy: the part left idle is what more packages at
# once (go test -p) could still use (issue 24).
read -r busy1 total1 < <(cpu_ticks)
echo "== CPU: $(( (busy1 - busy0) * 100 / (total1 - total0 + 1) ))% busy over the run, $(nproc) CPUs"
echo "== CPU seconds of each package's tests, with the processes they waited for (not compiling)"
sort -k2,2 -rn "$RAID10_CPU_LOG" | awk '{ printf "  %-28s %8.1f CPU s %8.1f s\n", $1, $2, $3; c += $2 }
  END { printf "  %-28s %8.1f CPU s\n", "total", c }'
if ((rc != 0)); then
  echo
  echo "== details of the failures (full log: $log)"
  grep -n -B40 -E '^\s*--- FAIL' "$log" | tail -n 400
  grep -n -A60 -E '^panic:' "$log" | head -n 200
fi
echo
echo "== skips (allow-list: hack/skips.txt)"
CGO_ENABLED=0 go run -trimpath ./hack/skipcheck -allow hack/skips.txt "$log"
skiprc=$?
if ((rc == 0 && skiprc != 0)); then
  rc=$skiprc
fi
exit "$rc"
