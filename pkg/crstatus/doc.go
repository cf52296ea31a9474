// Package crstatus translates the disk pool's state into the status of the custom resources
// (Raid10Volume, Raid10Snapshot, Raid10Node), and a Raid10Volume's spec into the pool's
// create options.
//
// Two writers use it, so that a volume reads the same whichever of them serves it: the node
// agent (package agent), which reconciles the resources through the API server, and the CSI
// driver's local store, which serves a pool without an API server.
//
// The functions are pure. Each takes the previous status, for condition transition times
// and a rebuild's start time, and the time now; none reads a clock or the pool itself.
//
//   - VolumeStatus, FailedStatus, ExpandPending, CreateFailedReason: a Raid10Volume.
//   - SnapshotStatus, SnapshotFailedStatus, SnapshotDeleteWaiting:
//     a Raid10Snapshot.
//   - NodeStatus and DiskIDs: a Raid10Node and the IDs its disks are listed by.
//   - ScrubStatus: a volume's status.scrub.
//   - CreateOptions: the pool's options for a volume's spec.
//   - EngineLimits: a volume's spec.limits as the engine's QoS limits.
package crstatus
