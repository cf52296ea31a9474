#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, idempotently:
#   1. Debian packages (QEMU and a kernel for the VM tests, real NBD clients, mkfs tools).
#   2. Tools built from pinned Go modules, cached under ~/.cache/raid10-csi keyed by version
#      (hack/build-tools.sh), so a second run, even from a fresh clone, skips them.
#   3. The newest kernel of the VM tests, unpacked into the cache (fetch_kernel).
#   4. The plugin image's Debian root filesystem (hack/image.sh --rootfs), cached the same way,
#      made beside the Go tools once the Debian packages are in.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(
  # VM harness: a real kernel with nbd, md raid10, brd, null_blk.
  qemu-system-x86 linux-image-amd64 busybox-static cpio kmod xz-utils zstd
  # The ublk tests' kernel: 6.1 is built without ublk, bookworm-security's 6.12 has
  # ublk_drv (about 1.5 min cold to download and unpack; the VM tests keep booting 6.1).
  linux-image-6.12-amd64
  # Real NBD clients and the reference server.
  libnbd-bin qemu-utils fio nbdkit nbd-client
  # Filesystems and block tools used by the node plugin and the tests.
  e2fsprogs xfsprogs util-linux mdadm
  # Encrypted volumes: cryptsetup (LUKS2 over the served device, pkg/crypt).
  cryptsetup-bin
  # unshare -n and ip: the node plugin attached from a fresh network namespace (TestNetNSInGuest).
  iproute2
  # Device-mapper tables swapped under a running array (test/diskfault: delay, error).
  dmsetup
  # Foreign signatures the pool must refuse (real mkfs in the signature tests).
  dosfstools btrfs-progs
  # test/cluster: the VM node's container runtime, CNI plugins (bridge with ipMasq needs
  # iptables) and socat, which carries each guest connection to the host's API server.
  containerd runc containernetworking-plugins iptables socat
  # make image (and test/cluster's images): the Debian root filesystem of the plugin image.
  mmdebstrap
)

# The Go tools need only Go: they build while apt downloads and unpacks (their log is printed
# after the packages). Both are the long poles of a cold run.
tools_log=$(mktemp "${TMPDIR:-/tmp}/raid10-build-tools.XXXXXX.log")
t0=$(date +%s)
bash hack/build-tools.sh >"$tools_log" 2>&1 &
tools_pid=$!

# The newest kernel of the VM tests (test/vm's NewestKernelSeries), NEWEST_KERNEL_VERSION of
# hack/versions.sh from Debian trixie-backports: downloaded with a private apt sources list,
# lists and cache (the host's apt state is never touched, nothing is installed), unpacked into
# ${RAID10_CACHE:-~/.cache/raid10-csi}/kernel-<version> as vmlinuz and lib/modules/<version>
# (with the modules.dep of `depmod -b`). Runs beside the packages and the Go tools; a finished
# directory is never fetched again. Needs dpkg, apt and kmod's depmod, all on a Debian host.
fetch_kernel() {
  # shellcheck source=hack/versions.sh
  source hack/versions.sh
  local ver=$NEWEST_KERNEL_VERSION cache=${RAID10_CACHE:-$HOME/.cache/raid10-csi}
  local dest=$cache/kernel-$ver apt=$cache/apt-trixie-backports
  if [[ -f $dest/vmlinuz && -f $dest/lib/modules/$ver/modules.dep && -f $dest/lib/modules/$ver/modules.builtin ]]; then
    echo "install-deps: kernel $ver cached in $dest"
    return 0
  fi
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  local mirror
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s trixie-backports main\n' \
    "${mirror:-http://deb.debian.org/debian}" >"$apt/src.list"
  local A=(-o "Dir::Etc::sourcelist=$apt/src.list" -o Dir::Etc::sourceparts=- \
    -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o APT::Sandbox::User=root)
  local work
  work=$(mktemp -d "$cache/.kernel-$ver.XXXXXX")
  # shellcheck disable=SC2064 # $work now: the trap runs after the function's locals are gone
  trap "rm -rf '$work'" EXIT # the function runs in a background subshell
  apt-get -qq "${A[@]}" update
  # linux-base-*: modules.builtin and modules.order (modprobe knows the built-in modules).
  (cd "$work" && apt-get -qq "${A[@]}" download "linux-binary-$ver" "linux-modules-$ver" "linux-base-$ver")
  for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  # The packages put both under /usr/lib/modules/<version> (merged /usr); depmod -b and
  # modprobe -d of kmod 30 (Debian 12) look in <base>/lib/modules/<version>.
  local src=$work/root/usr/lib/modules/$ver
  [[ -d $src ]] || src=$work/root/lib/modules/$ver
  local img
  img=$(find "$work/root" -name "vmlinuz*" -type f | head -n 1)
  if [[ -z $img || ! -d $src/kernel ]]; then
    echo "install-deps: kernel $ver: no vmlinuz or modules in linux-{binary,modules}-$ver" >&2
    return 1
  fi
  mkdir -p "$work/out/lib/modules"
  mv "$img" "$work/out/vmlinuz"
  rm -f "$src/vmlinuz"
  mv "$src" "$work/out/lib/modules/$ver"
  # kmod (depmod) is among DEB_PACKAGES, which may still be installing on a fresh machine.
  local i
  for ((i = 0; i < 300; i++)); do command -v depmod >/dev/null && break; sleep 2; done
  depmod -b "$work/out" "$ver"
  rm -rf "$dest"
  mv "$work/out" "$dest"
  echo "install-deps: kernel $ver unpacked into $dest ($(du -sh "$dest" | cut -f1))"
}
kernel_log=$(mktemp "${TMPDIR:-/tmp}/raid10-kernel.XXXXXX.log")
fetch_kernel >"$kernel_log" 2>&1 &
kernel_pid=$!

missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  # INITRD=No: the kernel packages make no initramfs of their own (three generations, minutes
  # each on 2 cores): the VM tests boot the kernel with the initramfs test/vm builds, and with
  # no /boot/initrd.img-* the triggers of later packages find nothing to update either.
  $SUDO env DEBIAN_FRONTEND=noninteractive INITRD=No \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: Debian packages present"
fi
echo "install-deps: Debian packages ready after $(( $(date +%s) - t0 ))s"

# The plugin image's Debian root filesystem (mmdebstrap, a Debian package above), cached
# under ~/.cache/raid10-csi/image: test/cluster builds the images with hack/image.sh. It
# downloads and unpacks beside the Go tools, which keep both CPUs busy for many minutes on
# a cold machine (it ran after them until session 14: 67 s more on a cold run).
rootfs_log=$(mktemp "${TMPDIR:-/tmp}/raid10-rootfs.XXXXXX.log")
bash hack/image.sh --rootfs >"$rootfs_log" 2>&1 &
rootfs_pid=$!

# await WHAT PID LOG: waits for a background job, prints its log, and stops the install if it
# failed; else says how long after the start it was ready.
await() {
  local what=$1 pid=$2 log=$3 rc=0
  wait "$pid" || rc=$?
  cat "$log"
  rm -f "$log"
  if ((rc != 0)); then
    echo "install-deps: $what FAILED (exit $rc)"
    exit "$rc"
  fi
  echo "install-deps: $what ready after $(( $(date +%s) - t0 ))s"
}
await "Go tools" "$tools_pid" "$tools_log"
await "newest VM kernel" "$kernel_pid" "$kernel_log"
await "root filesystem" "$rootfs_pid" "$rootfs_log"
