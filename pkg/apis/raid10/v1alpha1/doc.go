// Package v1alpha1 holds the raid10.csi.io/v1alpha1 API: the custom resources through which
// the controller plugin and the node agent talk.
//
//   - Raid10Volume (cluster-scoped, short name r10v) is written by the controller plugin in
//     CreateVolume: spec.node, spec.sizeBytes, the layout and the filesystem. The node agent
//     on spec.node reconciles it (carves extents, assembles the array, attaches it) and reports
//     status: phase, health, members, rebuild progress, device path and conditions. The
//     controller waits for status.phase Ready with status.observedGeneration equal to
//     metadata.generation. Deletion goes through the finalizer VolumeFinalizer, which the node
//     agent removes once the volume's extents are free again.
//   - Raid10Node (cluster-scoped, short name r10n, named after the Kubernetes node) is written
//     by the node agent only: the node's disks and its raw, usable (after mirroring) and free
//     capacity. The controller reads it for capacity checks and GetCapacity.
//
// Sizes that the engine computes with are exact int64 byte counts; sizes that a person reads in
// `kubectl get` are resource.Quantity values (printed as 10Gi).
//
// +kubebuilder:object:generate=true
// +groupName=raid10.csi.io
package v1alpha1
