#!/usr/bin/env bash
# The main job on the embedded default, without a cluster: 4 sparse files as disks, the
# standalone node agent (kubectl-raid10 --local serve), one RAID10 volume served over NBD
# on a unix socket, data written and verified through real NBD clients (nbdcopy, nbdinfo,
# qemu-io), one disk failed, the volume Degraded, the disk replaced, the rebuild followed
# until Healthy, the data verified again, and the agent restarted to show reassembly.
#
# Environment: DEMO_DIR (work directory, default a fresh mktemp -d), KEEP=1 keeps it,
# DEMO_DISK_SIZE (default 512M), DEMO_VOLUME_SIZE (default 256Mi),
# DEMO_REBUILD_RATE (bytes/s, default 48 MiB/s so that the progress is visible).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${DEMO_DIR:-$(mktemp -d /tmp/raid10-demo.XXXXXX)}
disk_size=${DEMO_DISK_SIZE:-512M}
vol_size=${DEMO_VOLUME_SIZE:-256Mi}
rate=${DEMO_REBUILD_RATE:-$((48 << 20))}
agent_pid=""
start=$(date +%s)

step() { printf '\n\033[1m==> [%3ds] %s\033[0m\n' "$(( $(date +%s) - start ))" "$*"; }
say() { printf '    %s\n' "$*"; }
fail() { printf '\033[31mdemo: FAILED: %s\033[0m\n' "$*" >&2; exit 1; }

cleanup() {
  if [[ -n "$agent_pid" ]] && kill -0 "$agent_pid" 2>/dev/null; then
    kill "$agent_pid" 2>/dev/null || true
    wait "$agent_pid" 2>/dev/null || true
  fi
  if [[ "${KEEP:-0}" != 1 && -z "${DEMO_DIR:-}" ]]; then
    rm -rf "$work"
  else
    echo "demo: work directory kept: $work"
  fi
}
trap cleanup EXIT

# The real NBD clients come from Debian packages; install just those when they are missing
# (make deps installs them too, with everything the tests need).
if ! command -v nbdcopy >/dev/null || ! command -v nbdinfo >/dev/null || ! command -v qemu-io >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "demo: installing the NBD clients (libnbd-bin, qemu-utils)"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends libnbd-bin qemu-utils >/dev/null
  fi
fi
for tool in nbdcopy nbdinfo qemu-io go; do
  command -v "$tool" >/dev/null || fail "$tool not found (make deps installs libnbd-bin and qemu-utils)"
done

mkdir -p "$work"
k10() { "$work/bin/kubectl-raid10" --local --run-dir "$work/run" "$@"; }
sock="$work/run/nbd/demo.sock"
uri="nbd+unix:///?socket=$sock"

step "Build kubectl-raid10 (local admin tool and standalone node agent)"
# cgo off and -trimpath, as the image's build: one compile of each package serves both, and
# make lint's and the tests' (test/vm's GoCommand) too.
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$work/bin/kubectl-raid10" ./cmd/kubectl-raid10)
say "$work/bin/kubectl-raid10"

step "Make 4 sparse files of $disk_size as disks"
mkdir -p "$work/disks"
for i in 0 1 2 3; do truncate -s "$disk_size" "$work/disks/disk$i.img"; done
ls -ls "$work/disks" | sed 's/^/    /'
cat >"$work/pool.json" <<JSON
{
  "name": "demo",
  "disks": [{"path": "$work/disks/disk*.img"}],
  "rebuildRateMax": $rate
}
JSON
say "pool configuration $work/pool.json:"
sed 's/^/      /' "$work/pool.json"

start_agent() {
  "$work/bin/kubectl-raid10" --local --pool-config "$work/pool.json" --run-dir "$work/run" serve \
    >>"$work/agent.log" 2>&1 &
  agent_pid=$!
  for _ in $(seq 100); do
    [[ -S "$work/run/admin.sock" ]] && k10 status >/dev/null 2>&1 && return 0
    kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.log"; fail "agent exited"; }
    sleep 0.1
  done
  cat "$work/agent.log"
  fail "agent did not come up"
}

stop_agent() {
  kill "$agent_pid"
  wait "$agent_pid" || true
  agent_pid=""
}

step "Start the node agent standalone (no cluster): it claims the blank disks"
start_agent
say "agent pid $agent_pid, log $work/agent.log"
k10 disks | sed 's/^/    /'

if command -v mkfs.ext4 >/dev/null; then
  step "A disk that is not blank is refused and left untouched"
  truncate -s 64M "$work/disks/ext4.img"
  mkfs.ext4 -q -F "$work/disks/ext4.img"
  before=$(sha256sum <"$work/disks/ext4.img")
  if k10 disk add "$work/disks/ext4.img" 2>"$work/refused.txt"; then fail "ext4 disk accepted"; fi
  fold -s -w 100 "$work/refused.txt" | sed 's/^/    /'
  [[ "$(sha256sum <"$work/disks/ext4.img")" == "$before" ]] || fail "ext4 disk modified"
  say "its bytes are unchanged (sha256 before = after)"
  rm -f "$work/disks/ext4.img"
fi

step "Create a $vol_size volume over the 4 disks"
k10 create demo "$vol_size" | sed 's/^/    /'
k10 status | sed 's/^/    /'

step "The volume over NBD on a unix socket (nbdinfo)"
nbdinfo "$uri" | grep -E 'export-size|description|can_flush|can_fua|can_trim|can_zero|can_multi_conn' | sed 's/^/    /'

step "Write the whole volume with random data through nbdcopy, read it back"
bytes=$(nbdinfo --size "$uri")
head -c "$bytes" /dev/urandom >"$work/data.bin"
want=$(sha256sum <"$work/data.bin" | cut -d' ' -f1)
nbdcopy --flush "$work/data.bin" "$uri"
got=$(nbdcopy "$uri" - | sha256sum | cut -d' ' -f1)
say "wrote   sha256 $want ($bytes bytes)"
say "read    sha256 $got"
[[ "$got" == "$want" ]] || fail "read back differs"
qemu-io -f raw -c "write -P 0x5a 1M 64k" -c "read -P 0x5a 1M 64k" -c flush "$uri" | sed 's/^/    qemu-io: /'
# keep data.bin equal to the volume
printf '\x5a%.0s' $(seq 65536) | dd of="$work/data.bin" bs=64k seek=16 conv=notrunc status=none
want=$(sha256sum <"$work/data.bin" | cut -d' ' -f1)

verify() {
  got=$(nbdcopy "$uri" - | sha256sum | cut -d' ' -f1)
  say "volume sha256 $got"
  [[ "$got" == "$want" ]] || fail "data differs after $1"
  say "data verified ($1)"
}

step "Fail one disk (disk1): every volume on it goes Degraded, I/O goes on"
k10 disk fail "$work/disks/disk1.img" | sed 's/^/    /'
k10 volumes | sed 's/^/    /'
k10 volumes -o json demo | grep -E '"(health|state|inSync)"' | sed 's/^/    /' | head -9
verify "disk failure"

step "Replace the failed disk with a new blank one; the volume rebuilds onto it"
truncate -s "$disk_size" "$work/disks/disk4.img"
k10 disk replace "$work/disks/disk1.img" "$work/disks/disk4.img" | sed 's/^/    /'
k10 wait demo --for Healthy --timeout 5m | sed 's/^/    /'
k10 status | sed 's/^/    /'
verify "rebuild"

step "Restart the node agent: the volume is reassembled from the pool labels"
stop_agent
start_agent
k10 volumes | sed 's/^/    /'
verify "restart"
stop_agent

step "Done in $(( $(date +%s) - start )) s"
