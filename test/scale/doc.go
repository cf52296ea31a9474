// Package scale runs many hollow nodes in one process against a real control plane, to
// find what grows with the cluster (issue 28).
//
// A hollow node (StartNode) is the real node agent (pkg/agent: its manager, whose cache
// holds only the node's own objects, its Raid10Volume, Raid10Snapshot and Raid10Node
// controllers and its poller) over a real pool (pkg/pool: labels, the allocator, one
// pkg/raid10 array per volume) whose disks are MemDisks, sparse in-memory members given
// to the pool through pool.Config.OpenDisk; and the real CSI node service, whose
// NodeGetInfo gives the Node's topology labels and the CSINode, as the kubelet registers
// them. No kernel, no NBD, no files: nothing is attached, staged or mounted.
//
// The tests (package scale's _test files) start etcd and kube-apiserver (test/kubeenv),
// the controller plugin in process and the real csi-provisioner with capacity tracking:
//
//   - TestHollowNodes (make test): ten nodes, 30 volumes created and deleted.
//   - TestHollowClaims (make test): four nodes with kube-scheduler and the PV binder;
//     twelve WaitForFirstConsumer claims, each with a pod, then twelve Immediate claims,
//     bound and spread over the nodes, then deleted.
//   - TestScaleBench (make scale-bench, not in make test): the cluster grows in steps
//     (SCALE_STEPS, default 10,100,1000) and each step measures provisioning, the API
//     server's request counts and memory; with CLAIMS, claims of both bindings, and what
//     kube-scheduler spent per pod (its own metrics, and with PROFILE its CPU profile);
//     the table is in docs/performance.md, "Scale".
package scale
