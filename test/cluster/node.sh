#!/bin/sh
# The test node (package test/cluster; see doc.go): runs in the QEMU guest, in the chroot of
# the host's root (test/vm), as root. It turns the guest into a Kubernetes node: network,
# the node's state disk, cgroup v2, containerd with the images imported, the kubelet; then
# it serves the host's commands until the host asks it to stop.
#
# The rig directory $RIG (shared read-write with the host) holds: containerd.toml,
# cni.conflist, kubelet.yaml, kubelet.kubeconfig, images.list ("SHA256 TARBALL" per image),
# and receives containerd.log, kubelet.log, node.log. Commands: the host writes cmd/N.sh;
# this script runs it and writes cmd/N.out and then cmd/N.rc. The host creates "stop" to
# end the node.
set -u
RIG=${RAID10_RIG:?RAID10_RIG not set}
log() { echo "node: [$(cut -d' ' -f1 /proc/uptime)] $*"; }
die() { log "FATAL: $*"; exit 1; }

# Network: eth0 on QEMU's restricted user network; the host is reachable only through the
# guestfwd addresses (the API server). Pods reach them through the bridge, masqueraded.
ip link set eth0 up || die "no eth0"
ip addr add "$NODE_IP/$NODE_PREFIX" dev eth0
ip route add default via "$NODE_GW"
echo 1 >/proc/sys/net/ipv4/ip_forward

# The node's state disk: containerd's root, the kubelet's directory, the plugin's state, the
# logs of pods. It carries /var/lib (the host's /var/lib stays hidden in the guest).
mount -t ext4 "$STATE_DEV" /var/lib || die "mount the state disk $STATE_DEV"
# The kubelet's mounts must propagate to the node plugin's container and back (Bidirectional).
mount --make-rshared /

# cgroup v2, every controller delegated to the kubelet's pods.
mount -t cgroup2 cgroup2 /sys/fs/cgroup || die "mount cgroup2"
for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
	echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || log "cannot delegate $c"
done

# What udev would do on a real node: /dev/disk/by-id links for the NVMe namespaces
# (nvme-<model>_<serial>, spaces as underscores), which the chart's disk list names.
mkdir -p /dev/disk/by-id
for b in /sys/block/nvme*n*; do
	[ -e "$b" ] || continue
	d=${b##*/}
	model=$(sed 's/ *$//; s/ /_/g' "$b/device/model")
	serial=$(sed 's/ *$//; s/ /_/g' "$b/device/serial")
	ln -sf "../../$d" "/dev/disk/by-id/nvme-${model}_${serial}"
done
ls -l /dev/disk/by-id/

start_containerd() {
	log "starting containerd"
	containerd --config "$RIG/containerd.toml" >>"$RIG/containerd.log" 2>&1 &
	CONTAINERD=$!
	i=0
	until ctr version >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 600 ] || die "containerd did not answer in 60 s"
		sleep 0.1
	done
}
start_containerd
# The images: images.list has one "SHA256 TARBALL" line per image; /var/lib/images.imported
# the sums already imported on this state disk. The host imports every image before the
# boot (rig.go, hostimport.go: natively, where this emulated CPU takes minutes), so this
# imports only what a hand-made state disk lacks.
touch /var/lib/images.imported
while read -r sum img; do
	[ -n "$img" ] || continue
	if grep -qx "$sum" /var/lib/images.imported; then
		log "image already imported: $img"
		continue
	fi
	ctr -n k8s.io images import "$img" >/dev/null || die "ctr import $img"
	log "imported $img"
done <"$RIG/images.list"
cut -d' ' -f1 "$RIG/images.list" >/var/lib/images.imported
ctr -n k8s.io images ls -q

mkdir -p /var/lib/log /var/lib/kubelet /var/lib/cni-conf.d
mount --bind /var/lib/log /var/log || die "bind /var/log"
cp "$RIG/cni.conflist" /var/lib/cni-conf.d/10-bridge.conflist

log "starting the kubelet"
"${KUBELET:-kubelet}" --config="$RIG/kubelet.yaml" --kubeconfig="$RIG/kubelet.kubeconfig" \
	--hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=2 >>"$RIG/kubelet.log" 2>&1 &
KPID=$!
# The API server's way to the kubelet (tunnel.go): the host cannot dial into the guest, so
# kubelet-tunnel.sh keeps one connection to the host's tunnel waiting, which the host joins
# to the kubelet's port when the API server needs it. Four waiting; each used one is
# replaced at once.
for _ in 1 2 3 4; do sh "$RIG/kubelet-tunnel.sh" "$KUBELET_TUNNEL" 10250 "$RIG/stop" & done
log "node up"
echo up >"$RIG/node.up"

# The host's commands, one at a time, in the order of their numbers.
mkdir -p "$RIG/cmd"
while [ ! -e "$RIG/stop" ]; do
	for f in "$RIG"/cmd/*.sh; do
		[ -e "$f" ] || continue
		n=${f%.sh}
		[ -e "$n.rc" ] && continue
		sh "$f" >"$n.out" 2>&1
		echo $? >"$n.rc.tmp" && mv "$n.rc.tmp" "$n.rc"
	done
	sleep 0.2
done
log "stopping the kubelet and containerd"
kill "$KPID" 2>/dev/null
wait "$KPID" 2>/dev/null
# Containers keep running under their shims after containerd ends. As systemd's shutdown
# does last on a real node, they get SIGTERM and a grace period (the node plugin removes its
# registration socket then); the VM powers off next. Without it the kubelet's next boot dials
# the old socket, fails and backs off (up to 2 min) before it registers the new one.
kill "$CONTAINERD" 2>/dev/null
wait "$CONTAINERD" 2>/dev/null
containers() { # the processes the shims run (each container's first process)
	for shim in $(pgrep -f containerd-shim); do pgrep -P "$shim"; done
}
for c in $(containers); do kill -TERM "$c" 2>/dev/null; done
i=0
while [ $i -lt 150 ] && [ -n "$(containers)" ]; do
	i=$((i + 1))
	sleep 0.1
done
log "containers stopped ($i tenths of a second)"
# The state disk only: the pods' filesystems sit on NBD devices whose servers (the node
# plugin and the holder) have just stopped, so a sync of everything waits on them until the
# host gives up on the VM (2 min; then the VM is cut off as by a power cut). The pods fsynced
# what they must keep; their other dirty pages are lost either way, as at a power cut.
sync -f /var/lib
log "node stopped"
