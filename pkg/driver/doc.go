// Package driver implements the CSI services of raid10.csi.io: identity, controller and (in a
// later step) node.
//
// The controller service does not touch disks. It writes a Raid10Volume custom resource for
// the node that the volume's topology names, and waits for that node's agent to report the
// volume Ready; deletion goes through a finalizer that the agent removes once the extents are
// free. It reaches the API server only through the VolumeStore interface (store.go), which
// KubeStore implements with a controller-runtime client.
//
// Errors: the services return the sentinels of errors.go, wrapped with context. The gRPC
// interceptor (interceptor.go) is the one place that maps them to gRPC status codes, with
// errors.Is, and logs every failed call with klog.
//
// Concurrency: operations on one volume are serialised by VolumeLocks; a second concurrent
// operation on the same volume fails at once with Aborted, as the CSI spec asks.
package driver
