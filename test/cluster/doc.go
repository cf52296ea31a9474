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
// TestClusterStory runs only with RAID10_CLUSTER_STORY=1 (`make cluster-test`; `make
// cluster-demo` also pauses after step 3 with the cluster up): it takes about 12 minutes
// under TCG plus the images and the control plane, more than `make test` may add. Each step
// logs its duration and the list is logged at the end; a run on the 2-core machine (other
// builds running beside it):
//
//	0 boot the node (containerd, images imported, kubelet Ready)   2m34s
//	1 helm install, 4 pods Ready, Raid10Node with 4 NVMe disks     1m3s
//	2 claims: Block, xfs, then a StatefulSet on ext4; ioverify     1m10s
//	3 3 volumes Healthy 4/4; kubectl get r10v, raid10 status/describe  0s
//	  bad input: 100Gi claim Pending (scheduler event), unknown
//	  StorageClass parameter named in ProvisioningFailed            2s
//	6 expand the ext4 claim 128Mi -> 256Mi (NodeExpandVolume)       1m34s
//	4 PCI-remove an NVMe disk under I/O: Degraded, 0 errors;
//	  kubectl raid10 replace-disk --follow onto the spare: Healthy  1m19s
//	5 helm upgrade (disk list, logLevel) under I/O: 0 errors, the
//	  holder pod kept; longest single I/O (the stall) 33 s (22 s in
//	  a second run)                                                 1m28s
//	7 VM restart on the same disks: pods back, data verified        1m27s
//	8 delete pods and claims: volumes gone, capacity back           18s
//	9 helm uninstall: no pod, CSIDriver or CSIStorageCapacity left  19s
//
// Step 6 runs before 4 because a volume grows only in place (docs/limitations.md): the
// expanded claim is created last, and the replacement disk's extents follow the rebuild's
// order. The stall of step 5 is the pod replacement under TCG (old container's exit about
// 15 s, the new pod's creation to its start about 18 s, process start to the devices
// reattached about 8 s). Every ioverify pod must log no ERROR line at any step.
//
// helm uninstall leaves the CRDs (helm never deletes crds/), the Raid10Node objects, the
// plugin's state directory on the node (the NBD state file) and the disks' pool labels.
//
// # Findings of the first real kubelet
//
// Listed in docs/install.md ("Verified on a real kubelet").
package cluster
