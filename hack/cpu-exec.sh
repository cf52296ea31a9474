#!/usr/bin/env bash
# go test -exec wrapper of hack/test.sh: runs one package's test binary and appends to
# $RAID10_CPU_LOG one line, "<package dir> <cpu s> <wall s>": the CPU time (user + system)
# of the test binary and of every process it waited for (the VMs' QEMU, the API servers,
# the plugin binaries), and its wall time. On a 2-core machine the test phase is bound by
# CPU, so this says where the budget goes (issue 24); compiling is go test's and not here.
# The test binary runs with the GOGC of hack/test.sh's caller (RAID10_TEST_GOGC; empty:
# unset), not the one its compiles ran with.
if [[ -n ${RAID10_TEST_GOGC+x} ]]; then
  if [[ -z $RAID10_TEST_GOGC ]]; then unset GOGC; else export GOGC=$RAID10_TEST_GOGC; fi
fi
start=$(date +%s%N)
"$@"
rc=$?
wall=$((($(date +%s%N) - start) / 1000000))
# times: the shell's user and system time, then its waited-for children's ("1m2.345s 0m0.5s");
# into a file, since in a pipe or $(...) it would run in a subshell that has no children.
tfile=$(mktemp)
times >"$tfile"
cpu=$(awk 'NR == 2 {
  n = 0
  for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] }
  printf "%.1f", n }' "$tfile")
rm -f "$tfile"
if [[ -n ${RAID10_CPU_LOG:-} ]]; then
  printf '%s %s %d.%03d\n' "${PWD#"${RAID10_ROOT:-}"/}" "$cpu" $((wall / 1000)) $((wall % 1000)) >>"$RAID10_CPU_LOG"
fi
exit "$rc"
