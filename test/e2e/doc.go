// Package e2e runs raid10-csi end to end on the host: a real etcd, kube-apiserver and
// kube-controller-manager (test/kubeenv), the chart's CRDs, RBAC, CSIDriver and StorageClass
// (deploy/raid10-csi.yaml), the controller service (pkg/driver over KubeStore) and the node
// agent (pkg/agent over a pool of file-backed disks) in the test process, each with the
// token of its chart ServiceAccount, and the real csi-provisioner and csi-resizer sidecars
// as subprocesses.
//
// TestRBACLeastPrivilege runs every flow on one control plane, each flow a subtest (one
// control plane for all of them: the flows used to run a second time each on a control plane
// of their own, 104 s of the package's 194 s; issue 24):
//
//   - PVCFlow: a claim on a WaitForFirstConsumer StorageClass, with the scheduler's
//     volume.kubernetes.io/selected-node annotation written by the test, is provisioned by
//     csi-provisioner through CreateVolume, bound by the PV controller, and built by the agent
//     (Raid10Volume Ready and Healthy). A larger request is expanded by csi-resizer through
//     ControllerExpandVolume (the claim then waits FileSystemResizePending for a kubelet).
//     The CSIStorageCapacity that the provisioner publishes for the node's topology segment
//     follows the pool's free space down on provisioning and expansion and back up when the
//     claim is deleted (reclaim Delete removes the PV, the Raid10Volume and the extents).
//     Then an encrypted claim (encryptedClaim): a StorageClass with encrypted: "true" and the
//     node-stage Secret named through the provisioner's templates; its PV records the
//     resolved spec.csi.nodeStageSecretRef and no other secret, and the Secret it names,
//     read as the kubelet reads it, keys NodeStageVolume (a rotation to its key, below).
//   - ControllerAgent: the CSI controller called over gRPC on its unix socket drives the
//     real agent: CreateVolume gives a Healthy Raid10Volume; a failed disk shows Degraded, a
//     replacement Rebuilding with its percentage, then Healthy, all read from the server-side
//     Table that `kubectl get r10v` prints; ControllerExpandVolume grows it in place;
//     DeleteVolume frees the space that GetCapacity reports.
//   - CapacityWithoutTopology, SnapshotFlow (snapshot, restore and clone through the real
//     csi-snapshotter and snapshot-controller) and RarePaths: the rare paths of the sidecars
//     and the agent (the provisioner's capacity owner found through its Pod and ReplicaSet, a
//     claim rescheduled for lack of room, an expansion that does not fit, repeated Events,
//     two disks failing at once, the StorageClass's CSIStorageCapacity deleted).
//
// The API server's audit log is on (kubeenv.WithAudit) and serves no streaming lists (as
// older API servers; the streaming path is that of every other real API server in the tests,
// pkg/agent's and the kubelet story's). At the end, no request of a chart ServiceAccount was
// denied, and every verb that deploy/'s RBAC grants it was used, or is listed in the test's
// unexercised with the reason. The used-vs-granted table of each ServiceAccount is logged.
// One flow alone: go test -run 'TestRBACLeastPrivilege/PVCFlow' (the audit check then reports
// the grants the other flows use as unused).
//
// There is no kubelet: the test creates the Node and the CSINode (driver raid10.csi.io with
// topology key raid10.csi.io/node) that the node plugin's registration would create, and no
// pod ever mounts the volume (NodeStage and NodePublish are tested under QEMU in pkg/driver).
// For the encrypted claim the test does the kubelet's part (stageAsKubelet): the Secret the
// PV names becomes NodeStageVolume's secrets, and the real node service with real
// cryptsetup, over a file keyed with the Secret's previousKey, rotates it to its key; the
// stage then stops at the mapping, since the host has no device-mapper.
//
// The audit check also requires that no chart ServiceAccount touched Secrets
// (secretsUntouched): only the kubelet reads the node-stage Secret.
//
// # Tools
//
// The control-plane binaries come from $RAID10_KUBE_BIN_DIR, csi-provisioner from
// $RAID10_CSI_PROVISIONER and csi-resizer from $RAID10_CSI_RESIZER, all built and cached by
// hack/build-tools.sh (make deps) and exported by hack/tool-env.sh. A missing one skips the test, or fails it under CI (internal/testenv).
// The tests also skip in -short mode and with RAID10_SKIP_HEAVY (make unit).
//
// # Logs
//
// The in-process controller and agent log through klog into klog.log, and each sidecar into
// <name>.log, under the test's temporary directory; the control plane logs
// under kubeenv's. When a test fails, the tail of each is printed.
package e2e
