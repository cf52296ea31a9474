#!/usr/bin/env bash
# Measures a cold CI run (issue 24) on this machine: `CI=true bash .ci/run` in a clean clone of
# HEAD, with a HOME of its own, so that everything .ci/run caches starts empty: the tools and
# the VM artefacts (~/.cache/raid10-csi), the Go build cache and the Go module cache. What it
# cannot make cold is the machine itself: Debian packages already installed are not installed
# again (a fresh machine spends its apt time there; .ci/run prints that phase's time).
#
#   bash hack/ci-cold.sh [DIR]      (DIR: scratch directory, default ~/raid10-ci-cold)
#
# DIR must not be under /tmp, /var/tmp, /run or /dev/shm: the VM guests mount a tmpfs of
# their own there (test/vm's doc), so the tools, images and test binaries cached under the
# run's HOME would be invisible to them (a run under /tmp failed every VM test that execs a
# host binary: "no such file or directory").
#
# The clone, the HOME and the log (DIR/ci.log) stay in DIR for a look afterwards; remove DIR to
# free its disk (about 15 GiB after a whole run). The figures mean something only on a quiet
# machine: the load average is printed at the start and the end, and a run that started above
# 1.5 says so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$HOME/raid10-ci-cold}
dir=$(realpath -m "$dir")
case $dir/ in
/tmp/* | /var/tmp/* | /run/* | /dev/shm/*)
  echo "ci-cold: $dir is under a directory the VM guests hide behind their own tmpfs; name another (default ~/raid10-ci-cold)" >&2
  exit 2
  ;;
esac
if [[ -e $dir ]]; then
  echo "ci-cold: $dir exists; remove it or name another directory" >&2
  exit 2
fi
mkdir -p "$dir/home"
git clone -q "$root" "$dir/src"
# The Go settings this machine keeps in its user's go env file (e.g. GOFLAGS) would be lost
# with the new HOME: carry them over as variables, as a fresh machine's image would have them.
goflags=$(go env GOFLAGS)
gotoolchain=$(go env GOTOOLCHAIN)
read -r load _ </proc/loadavg
echo "ci-cold: $(date -u +%FT%TZ) HEAD $(git -C "$dir/src" rev-parse --short HEAD), load average $load, $(nproc) CPUs"
if awk -v l="$load" 'BEGIN { exit !(l > 1.5) }'; then
  echo "ci-cold: WARNING: the machine is busy (load average $load): the times will be too long"
fi
start=$(date +%s)
rc=0
(
  cd "$dir/src"
  env -u GOCACHE -u GOMODCACHE -u GOPATH -u RAID10_CACHE HOME="$dir/home" CI=true \
    GOFLAGS="$goflags" GOTOOLCHAIN="$gotoolchain" bash .ci/run
) >"$dir/ci.log" 2>&1 || rc=$?
read -r load _ </proc/loadavg
echo "ci-cold: exit status $rc after $(($(date +%s) - start)) s; load average $load at the end; log $dir/ci.log"
grep -E '^(ci|install-deps|build-tools|image): ' "$dir/ci.log" || true
exit "$rc"
