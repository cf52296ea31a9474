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
//     masquerade: no kube-proxy and no chart setting. The API server cannot reach the
//     kubelet (no `kubectl logs` or `exec`): the test reads pod logs from the node's
//     /var/log/pods and runs node commands through Rig.Exec (a command file on the shared
//     rig directory).
//   - Images, without Docker or a registry: `make image` (hack/image.sh) writes the plugin,
//     pause, csi-provisioner and csi-resizer tarballs; the test adds raid10-csi/ioverify
//     (test/cluster/ioverify, the workload); node.sh imports them with
//     `ctr -n k8s.io images import` once per state disk.
//   - The kubelet authenticates with the admin token (the rig runs RBAC only, no node
//     authorizer) and answers no one (anonymous, AlwaysAllow; unreachable from the host).
//
// # The story (story_test.go)
//
// Each step logs its duration; the whole list is logged at the end. See TestClusterStory.
//
// # Findings of the first real kubelet
//
// Listed in docs/install.md ("Verified on a real kubelet").
package cluster
