// Package cluster runs the user's story on a real node (issue 15): a control plane on the
// host, one Kubernetes node in the QEMU VM with a real containerd and kubelet, the chart
// installed with `helm install`, claims and pods that write and verify through the driver.
//
// # The rig (rig.go, node.sh)
//
//   - Control plane on the host (test/kubeenv): etcd, kube-apiserver, kube-controller-manager,
//     kube-scheduler, built from k8s.io/kubernetes v1.37.2 by hack/build-tools.sh. The API
//     server's Service range is 10.0.1.0/24, so the "kubernetes" Service's ClusterIP is
//     10.0.1.1, and its serving certificate includes that address.
//   - The node: the distribution kernel under QEMU TCG (test/vm) with 5 emulated NVMe disks
//     (raw files, serials R10DISK0..4) and a virtio state disk (ext4, made on the host) that
//     carries the guest's /var/lib: containerd's root, the kubelet's directory, the plugin's
//     state, the pods' logs. The guest runs the host's own binaries over 9p: containerd
//     1.6.20 and runc 1.1.5 from Debian, the CNI plugins from Debian
//     containernetworking-plugins (bridge with ipMasq, host-local), the kubelet built with
//     the control plane. node.sh makes the /dev/disk/by-id/nvme-* links udev would make.
//   - Network: QEMU user networking with restrict=on; the guest's only way out is a guestfwd
//     of 10.0.1.1:443 to the API server on the host's loopback (socat per connection). The
//     kubelet uses that address; pods reach it as the kubernetes Service's ClusterIP, which
//     the kubelet puts in KUBERNETES_SERVICE_HOST, through the bridge and iptables
//     masquerade: no kube-proxy and no chart setting. The API server is to reach the
//     kubelet (`kubectl logs`, `exec`, port-forward) the other way round (tunnel.go):
//     node.sh keeps connections to a second guestfwd waiting (kubelet-tunnel.sh), and the
//     API server's egress selector sends its CONNECTs to the rig's proxy, which joins each
//     to one of them. The story reads a pod's log and runs a command in it through the API
//     server (step 3). Node commands outside
//     any container run through Rig.Exec (a command file on the shared rig directory).
//   - Images, without Docker or a registry: `make image` (hack/image.sh) writes the plugin,
//     pause, csi-provisioner, csi-resizer and csi-snapshotter tarballs; the test adds
//     raid10-csi/ioverify (test/cluster/ioverify, the workload). The host imports them into
//     the node's state disk (hostimport.go): it mounts the disk on a loop device and runs
//     its own containerd on it, the very binary the guest runs (from the host's root), with
//     `ctr -n k8s.io images import`, each image once per state disk (by its tarball's
//     SHA-256, recorded in the disk's images.imported). Natively that takes about 10 s for
//     all six; under TCG, in the guest, it took minutes (every layer decompressed and
//     unpacked by the emulated CPU). node.sh imports in the guest only what the disk's record
//     lacks: nothing, as the rig makes it.
//   - The state disk's cache: the host keeps a sparse copy of the disk, images imported and
//     nothing else yet, under ~/.cache/raid10-csi/vm/cluster/state-<key>.img (key: a recipe
//     version, the disk's size, containerd's version; state-<key>.list names the images'
//     sums). The next rig starts from that copy and imports only what changed: usually the
//     plugin image, whose Debian layer containerd already holds.
//   - The kubelet authenticates with the admin token (the rig runs RBAC only, no node
//     authorizer) and lets the API server in anonymously (AlwaysAllow; only the tunnel
//     reaches it).
//
// # The story (story_test.go)
//
// TestClusterStory runs in `make test` (hack/test.sh; under CI a missing part fails it, and
// only -short skips it, as heavy); `make cluster-test` runs it alone and `make
// cluster-demo` pauses it after step 3 with the cluster up. Each step logs its duration and
// the list is logged at the end (docs/install.md, "Verified on a real kubelet", has the
// times of the last full run). Where the time goes under TCG:
//
//   - The node's boot: 20 to 50 s (boot, containerd, kubelet Ready), the images imported on
//     the host before it (10 s cold). With the import in the guest it was about 2 minutes
//     when the plugin image changed and 3 to 6 minutes on a cold cache.
//   - Pod starts: each pod sandbox and container start takes 10 to 30 s on the emulated
//     CPUs. The story installs one controller pod (four containers), not the chart's two:
//     on a one-node rig a second replica adds no availability, only container starts at
//     install and at the reboot. Step 5 changes node values only (node.logLevel and the
//     disk list), so it rolls the node DaemonSet alone and checks that the controller pods
//     were left running: rolling them too added 1 to 6.5 minutes of container starts and
//     tested nothing of the I/O path.
//   - ioverify writes and verifies 2 MiB in 64 KiB blocks per round (a few seconds a
//     round), so "two more rounds" after an event waits seconds, not minutes (with 4 KiB
//     blocks a round took up to a minute under load).
//   - The kubelet resyncs pods every 10 s (syncFrequency; default 1 min), so
//     NodeExpandVolume follows the controller's expansion within seconds.
//
// Step 6 runs before 4 because a volume grows only in place (docs/limitations.md): the
// expanded claim is created last, and the replacement disk's extents follow the rebuild's
// order. Step 5's node DaemonSet surges: the new plugin pod waits Ready beside the old one
// and takes the devices from it when the old pod is deleted, so its stall is the handover,
// not the pod replacement (docs/install.md has the figures). Every ioverify pod must log no
// ERROR line at any step.
//
// The encrypted step (crypt_test.go; issue 27) provisions a claim of a StorageClass with
// encrypted: "true" and the node-stage Secret: the real csi-provisioner names the Secret in
// the PV, the kubelet passes the key to NodeStageVolume, and the node plugin's container
// formats and opens LUKS2 over the volume's device (the chart's node.crypt values set pbkdf2
// with 1,000 iterations, as the VM tests do: argon2id's tuned seconds on the emulated CPUs
// test nothing here). Its pod writes ioverify blocks carrying a marker, as io-xfs's carry
// another; the host then reads the pool's four disk images: both copies of every io-xfs
// block are there (the scan's positive control), and the encrypted pod's marker nowhere.
// The claim is deleted at the end of the step, before step 6 grows the ext4 claim in place.
//
// The reboot (step 7) stops the node as a real shutdown does: the kubelet, then containerd,
// then SIGTERM to every container left under its shim with a 15 s grace period, then power
// off. The node plugin then removes its registration socket; after a power cut it stays, and
// the kubelet's next boot backs off on it (docs/install.md).
//
// helm uninstall leaves the CRDs (helm never deletes crds/), the Raid10Node objects, the
// plugin's state directory on the node (the NBD state file) and the disks' pool labels.
//
// # Findings of the first real kubelet
//
// Listed in docs/install.md ("Verified on a real kubelet").
package cluster
