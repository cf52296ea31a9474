#!/bin/busybox sh
# /init of the raid10-csi test VM (package test/vm; see doc.go). It runs as PID 1
# under busybox sh, mounts the host root (read-only) and the run directory
# (read-write) over 9p, then sources the per-run /vmrun/config.sh written by the
# host, which defines RUN_DIR, WORK_DIR and vm_setup. The command's stdout+stderr
# go to /vmrun/output and its exit status to /vmrun/exit; then the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
H=/host
OPTS=trans=virtio,version=9p2000.L,msize=262144

log() { echo "raid10-vm: [$(cut -d' ' -f1 /proc/uptime)] $*"; }
# NO_EXIT_SYNC (config.sh, Options.NoExitSync): the command synced what it keeps; busybox's
# poweroff syncs unless given -n.
halt() { if [ -n "${NO_EXIT_SYNC:-}" ]; then poweroff -n -f; else sync; poweroff -f; fi; sleep 5; exit 1; }
fatal() { echo "raid10-vm: FATAL: $*"; halt; }

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
log "init: kernel $(uname -r)"
# No NIC (-nodefaults), but loopback must be up for 127.0.0.1 servers.
ip link set lo up
hostname raid10-vm
while read -r ko; do
	insmod "$ko" || log "insmod $ko failed"
done </modules.list
mount -t 9p -o "$OPTS,ro,cache=loose" hostroot $H || fatal "mount 9p hostroot"
mount -t 9p -o "$OPTS" vmrun /vmrun || fatal "mount 9p vmrun"
[ -f /vmrun/config.sh ] || fatal "no /vmrun/config.sh"

# Helpers for config.sh.
vm_mount_std() {
	mount -t proc proc $H/proc || fatal "mount proc"
	mount -t sysfs sysfs $H/sys || fatal "mount sysfs"
	mount -t devtmpfs devtmpfs $H/dev || fatal "mount devtmpfs"
	mkdir -p $H/dev/pts $H/dev/shm
	mount -t devpts devpts $H/dev/pts
	mount -t tmpfs -o mode=1777 tmpfs $H/dev/shm
	for d in /tmp /run /var/tmp; do
		mount -t tmpfs -o mode=1777 tmpfs $H$d || fatal "mount tmpfs $d"
	done
	mkdir -p $H/run/lock
}
# vm_bind_run PATH: the run directory at its host path inside the chroot.
vm_bind_run() {
	mkdir -p "$H$1" 2>/dev/null
	mount --bind /vmrun "$H$1" || fatal "bind run dir $1"
}
# vm_share TAG PATH: a read-write 9p share at its host path inside the chroot.
vm_share() {
	mkdir -p "$H$2" 2>/dev/null
	mount -t 9p -o "$OPTS" "$1" "$H$2" || fatal "mount 9p $1 at $2"
}
# vm_modprobe MODULE [PARAM...]: the host's modprobe (kmod: it knows softdeps),
# over the host's /lib/modules. The full path matters: busybox would run its own
# modprobe applet for a bare "modprobe".
vm_modprobe() {
	chroot $H /sbin/modprobe "$@" || log "modprobe $* failed"
}
# vm_kernel_modules DIR VERSION: the modules of a kernel unpacked into the cache (not one
# installed on the host) are in DIR; the chroot sees them at /lib/modules/VERSION, so the
# host's modprobe, and whatever runs in the guest, finds them as for an installed kernel. A
# tmpfs over the read-only share's /lib/modules gives the mount point (the host's other
# kernels' modules are of no use to this one).
vm_kernel_modules() {
	mount -t tmpfs -o mode=0755 tmpfs $H/lib/modules || fatal "mount tmpfs on /lib/modules"
	mkdir -p "$H/lib/modules/$2"
	mount --bind "$H$1" "$H/lib/modules/$2" || fatal "bind $1 at /lib/modules/$2"
}
vm_mount_configfs() {
	if [ -d $H/sys/kernel/config ] && grep -q configfs /proc/filesystems; then
		mount -t configfs configfs $H/sys/kernel/config 2>/dev/null
	fi
}

. /vmrun/config.sh
vm_setup
# The host root (with everything mounted in it) becomes the mount namespace's root, as
# switch_root makes it, so that a process entering the namespace (nsenter
# --mount=/proc/1/ns/mnt: Kubernetes' host-exec pods) lands in it, not in the initramfs.
# This script keeps the initramfs as its own root (a mount over / is not crossed from a
# process's root), with /vmrun and busybox; "." is the host root now, for the command's
# chroot.
cd $H && mount --move . / || fatal "move the host root to /"
log "ready"
# The command runs in its own session, so the watchdog can signal all of it.
setsid chroot . /bin/sh -c '. "$0/env.sh" && cd "$1" && exec /bin/sh "$0/script.sh"' \
	"$RUN_DIR" "$WORK_DIR" >/vmrun/output 2>&1 </dev/null &
pid=$!
wd=
if [ -n "$CMD_TIMEOUT" ]; then
	# Guest-side watchdog, before the host kills QEMU: SIGQUIT makes a Go test
	# binary print every goroutine's stack into the output.
	(
		sleep "$CMD_TIMEOUT"
		log "watchdog: command still running after ${CMD_TIMEOUT}s: SIGQUIT, then SIGKILL in 10s"
		echo "$CMD_TIMEOUT" >/vmrun/timedout
		kill -QUIT -$pid
		sleep 10
		kill -KILL -$pid
	) &
	wd=$!
fi
wait $pid
rc=$?
[ -n "$wd" ] && kill $wd 2>/dev/null
echo "$rc" >/vmrun/exit.tmp && mv /vmrun/exit.tmp /vmrun/exit
log "exit status $rc"
halt
