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
// A planned restart hands the live sockets over (handover.go, holder.go): Attacher.HandOver
// stops each connection at a request boundary (nbd.Server.HandOver) and returns the devices
// with their open sockets and the bytes read and not executed; the process closes its arrays,
// passes duplicates of the sockets (SCM_RIGHTS over a unix socket in the state directory) to
// a successor (TakeHandover from the HandoverListener) or to a Holder (GiveHandover), which
// keeps them unread until the next process takes them; that one opens the arrays only then,
// and Attacher.Adopt serves each socket from the byte where the old process stopped. The
// kernel never sees a connection end.
//
// When the serving process dies instead, the kernel's ends see EOF and the kernel marks every
// connection dead. Requests the dead process had read are lost with it: the kernel requeues
// them when their timeout (DefaultTimeout, 10 s) expires. New requests wait for a live
// connection for up to the dead-connection timeout (DefaultDeadConnTimeout, 10 min). A
// restarted process reads the state file, checks that the device still carries its backend
// identifier, and hands fresh socketpairs to the same device with NBD_CMD_RECONFIGURE; the
// queued and requeued requests then run on the new connections and the filesystem above
// never sees an error. The same path repairs a single connection that breaks while the
// process lives (a request timeout makes the kernel shut the socket down): every connection
// that ends without a Detach is replaced. Reclaim finds the devices a process leaked by dying
// between NBD_CMD_CONNECT and its state write (our backend identifier, a dead connecting
// process): it records them, or disconnects one whose volume is recorded elsewhere. Whether
// the connecting process lives is whether it still holds the flock on its owner file in the
// state directory, which lists the volumes it is connecting (owner.go): a check that holds
// across PID namespaces, unlike the PID in /sys/block/nbdX/pid.
//
// # Resize
//
// When the volume grows (the RAID10 array under the export grew online), Attacher.Resize
// sends NBD_CMD_RECONFIGURE with the backend identifier, NBD_ATTR_SIZE_BYTES and
// NBD_ATTR_BLOCK_SIZE_BYTES and no sockets. The kernel's nbd_genl_reconfigure calls
// nbd_genl_size_set, which calls nbd_set_size for a changed size; nbd_set_size updates the
// capacity with set_capacity_and_notify (drivers/block/nbd.c; reconfigure learned sizes in
// Linux 5.3, "nbd: add netlink reconfigure resize support", and Debian's 6.1 has it). The
// device grows in place, under a mounted filesystem, with its connections and queued
// requests untouched; /sys/block/nbdX/size shows the new size at once and resize2fs or
// xfs_growfs can follow. Shrinking is never asked for. The export advertises the new size to
// any later handshake too (blockdev.Backend.Size is read each time).
//
// # Ownership
//
// Only a device this process connected (NBD_CMD_CONNECT without an index: the kernel picks
// an unconfigured device atomically) or one recorded in the state file with a matching
// /sys/block/nbdX/backend is ever reconfigured or disconnected. The state file is written
// atomically: a temporary file, fsync, rename, fsync of the directory.
package kernel
