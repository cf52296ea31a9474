// Package kernel attaches NBD exports to the Linux kernel's nbd driver over generic netlink
// (family "nbd", include/uapi/linux/nbd-netlink.h) and keeps them attached across restarts
// of the serving process.
//
// The kernel never negotiates: each connection is one end of a unix socketpair whose other
// end the nbd.Server serves with ServeAttached. NBD_CMD_CONNECT hands the kernel its ends
// (several connections: the export advertises CAN_MULTI_CONN), the block size, the size, the
// request timeout, the dead-connection timeout, the export's transmission flags and a backend
// identifier ("raid10-csi:<volume>"), which the kernel shows in /sys/block/nbdX/backend and
// checks on every NBD_CMD_RECONFIGURE.
//
// # Restarts
//
// When the serving process dies, the kernel's ends see EOF and the kernel marks every
// connection dead. Requests the dead process had read are lost with it: the kernel requeues
// them when their timeout expires. New requests wait for a live connection for up to the
// dead-connection timeout. A restarted process reads the state file, checks that the device
// still carries its backend identifier, and hands fresh socketpairs to the same device with
// NBD_CMD_RECONFIGURE; the queued and requeued requests then run on the new connections and
// the filesystem above never sees an error. The same path repairs a single connection that
// breaks while the process lives (a request timeout makes the kernel shut the socket down):
// every connection that ends without a Detach is replaced.
//
// # Ownership
//
// Only a device this process connected (NBD_CMD_CONNECT without an index: the kernel picks
// an unconfigured device atomically) or one recorded in the state file with a matching
// /sys/block/nbdX/backend is ever reconfigured or disconnected. The state file is written
// atomically: a temporary file, fsync, rename, fsync of the directory.
package kernel
