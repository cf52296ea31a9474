// Package driver implements the CSI services of raid10.csi.io: identity, controller and node.
//
// The controller service does not touch disks. It writes a Raid10Volume custom resource for
// the node that the volume's topology names, and waits for that node's agent to report the
// volume Ready; deletion goes through a finalizer that the agent removes once the extents are
// free. It reaches the API server only through the VolumeStore interface (store.go), which
// KubeStore implements with a controller-runtime client. In the standalone mode (ModeAll,
// no cluster) LocalStore (localstore.go) implements it over the node's own pool instead: it
// creates, grows and deletes pool volumes as the calls come and reports their status as the
// node agent would, so the controller's logic is the same in both modes.
// ControllerModifyVolume (controller_modify.go) merges a VolumeAttributesClass's QoS limits
// (params_limits.go, the one parser of those keys, also for CreateVolume) into spec.limits.
//
// The node service (node.go) serves volumes of this node's pool. It reaches them only through
// the VolumeAttacher interface it declares, which the node's data path, attach.PoolAttacher,
// implements (a volume's array served over NBD or ublk, recorded so that a restarted plugin
// reattaches it without an I/O error above). Mounting goes through an injected mount-utils
// Interface and exec: NodeStageVolume formats a device only when blkid finds it blank and
// refuses one holding another filesystem; publish is a bind mount (of the device node for
// Block).
//
// Health (CSI 1.13): the node service answers NodeGetVolumeHealth and NodeGetStorageHealth
// from its pool (PoolHealth, health_node.go), the controller ControllerGetVolumeHealth and
// ControllerListVolumeHealth from the Raid10Volume status (health_controller.go); one
// function (health.go) turns a volume's status into CSI entries for both.
//
// Errors: the services return the sentinels of errors.go, wrapped with context, or the data
// path's (package attach). The gRPC interceptor (interceptor.go) is the one place that maps
// them to gRPC status codes (codeOf, with errors.Is) and logs every failed call with klog.
//
// Concurrency: operations on one volume are serialised by VolumeLocks; a second concurrent
// operation on the same volume fails at once with Aborted, as the CSI spec asks.
package driver
