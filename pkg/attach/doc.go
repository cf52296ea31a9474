// Package attach is the node's data path: it serves a volume of the local disk pool as a
// block device.
//
//	pool volume -> raid10.Array (the engine, a blockdev.Backend)
//	            -> frontend: nbd.Server + nbd/kernel (netlink)  -> /dev/nbdX
//	                      or ublk.Device (io_uring)             -> /dev/ublkbN
//
// PoolAttacher owns every device this process serves. AttachFrontend picks the frontend
// (Frontend: the StorageClass's choice, else the node's --frontend as ResolveFrontend turns
// it into nbd or ublk), opens the volume's array in the pool and starts its server. The NBD
// devices are recorded in the kernel package's state file and the ublk devices in their own
// (UblkStateFile), so that a restarted plugin reattaches (Reattach, NBD_CMD_RECONFIGURE) or
// recovers (EnableUblk, ublk user recovery) them with the kernel's queued I/O intact.
//
// A rolling update hands the NBD devices to the successor process without the kernel
// noticing (HandOver, Adopt; kernel.Handed carries the sockets over SCM_RIGHTS); ublk
// devices are detached and recovered by the successor. Ready is the readiness check (every
// NBD device has a served connection) and IOStats the request counters the metrics export.
//
// The package knows nothing of CSI or Kubernetes: the CSI node service (package driver)
// calls it through a narrow interface and maps its sentinels (errors.go) and the pool's
// pool.ErrNotFound to gRPC codes.
package attach
