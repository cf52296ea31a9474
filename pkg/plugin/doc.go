// Package plugin is the raid10-csi plugin's lifecycle: what cmd/raid10-csi runs once its
// flags are parsed into Options and validated. Run starts the mode's process and serves it
// until its context ends.
//
// # The processes
//
//   - controller: the CSI identity and controller services over Raid10Volume custom
//     resources (driver.KubeStore); no disk.
//   - node: the node's disk pool, the NBD (or ublk) attacher over it, the CSI node
//     service, the node agent that reconciles the node's Raid10Volumes, the admin socket
//     (pkg/admin) and the kubelet plugin registration.
//   - all: node and controller in one process without a cluster; the controller
//     provisions straight in the pool (driver.LocalStore).
//   - holder: a Holder that keeps a stopped node plugin's devices for the next one.
//
// Every mode serves /metrics, /healthz and /readyz on Options.MetricsAddress.
//
// # Start (node and all modes)
//
// The frontend is resolved first, so that a node that cannot serve it fails while its
// predecessor still serves. Then the devices are taken over: from a predecessor that
// still serves --state-dir (a surge update; the successor waits, healthy and Ready on its
// metrics address through a standby server, until the predecessor is told to stop), else
// from the holder, else none (the devices recorded in --state-dir are reattached). Only
// then is the pool opened: the same disks are never open in two processes.
//
// # Stop (node and all modes)
//
// When its context ends, a node plugin runs the stop sequence (handover.stopSequence):
//
//  1. hand to a successor: one that waits (or connects from now on) gets the devices;
//  2. else hand to the holder, if one listens on --state-dir;
//  3. else wait up to --handover-wait for a successor, serving meanwhile.
//
// A handover stops I/O at a request boundary, closes the arrays and passes the devices'
// sockets. With no one to take them the devices stay attached and the next plugin
// reattaches them (requests in flight then wait for the kernel's request timeout).
package plugin
