// Package agent is the raid10.csi.io node agent: the Kubernetes side of a node's disk pool.
// It translates between the custom resources (pkg/apis/raid10/v1alpha1) and pkg/pool, which
// knows nothing of Kubernetes, the way TopoLVM's node agent does: the controller plugin
// writes a Raid10Volume, the agent of the node it names makes the array and reports status.
//
// # Use
//
//	p, _ := pool.Open(cfg)
//	err := agent.Run(ctx, restConfig, agent.Options{NodeName: node, Pool: p})
//
// Run builds a controller-runtime manager (NewManager: its cache holds only this node's
// Raid10Volumes, selected by the CRD's selectable field spec.node, and this node's
// Raid10Node; no leader election, no metrics or probe servers of its own) and runs the
// agent until ctx is done. A caller with its own manager uses New and SetupWithManager.
//
// # Raid10Volume (spec.node == NodeName)
//
//   - Create: the pool volume of the object's name, spec.sizeBytes, spec.layout.members and
//     spec.layout.chunkSizeBytes
//     (pool.CreateVolume is idempotent by name, so a retry after a crash finds it). Status
//     phase Ready, condition Ready True (reason Provisioned). A volume the pool has no room
//     for is phase Failed with condition Ready False, reason InsufficientCapacity (the
//     controller answers ResourceExhausted); other refusals get reason CreateFailed. A
//     failed create is not retried for the same generation.
//   - A volume that was provisioned (status.capacity set) but is no longer in the pool is
//     never created afresh: phase Failed, health Failed, reason NotInPool.
//   - Expand: when spec.sizeBytes exceeds the array, pool.ExpandVolume. While the pool
//     refuses (not Healthy, no room right after an extent) the phase is Expanding, the
//     message says why, an ExpansionFailed Event is recorded, and it is retried every 15 s
//     and on every health change.
//   - Delete: once metadata.deletionTimestamp is set, pool.DeleteVolume frees the extents,
//     then the agent removes the finalizer v1alpha1.VolumeFinalizer (raid10.csi.io/extents)
//     that the controller set. An object without that finalizer gets it before its extents.
//   - Status: observedGeneration, phase, health (Healthy, Degraded, Rebuilding, Failed, as
//     pool.Health), capacity, members (index, disk ID as in the Raid10Node, state InSync,
//     Rebuilding, Failed or Missing, bad blocks and request timeouts), inSync ("3/4"),
//     badBlocks and lostBlocks (the engine's counts; either makes the volume Degraded, and
//     the message and the Ready condition say so), rebuild (member, percent, done and
//     total bytes, rate, ETA, start time; only while a recovery runs; a resync's progress
//     goes to the message), message, condition Ready, and devicePath: the /dev/nbdX the node
//     plugin's attacher serves the volume on (Options.Devices), empty while it is not
//     attached. The agent is the only writer of the status; the attacher is only asked, and
//     the poller's fingerprint includes the device, so an attach or detach shows within a
//     poll interval.
//   - Device growth: after the array grew, the agent grows the attached device too
//     (Devices.Expand, NBD_CMD_RECONFIGURE with the new size), so a Block volume sees its new
//     size without NodeExpandVolume; a failure is retried with the expansion's 15 s.
//   - QoS limits (limits.go): spec.limits go to pool.SetVolumeLimits whenever they differ
//     from what this agent last set for the volume, so also once after every start (the
//     pool keeps limits in memory only); the pool gives them to an array assembled later.
//     status.limits reports them once set; an Event LimitsSet when they change, LimitsFailed
//     (retried every 15 s) when the pool refuses them.
//   - Rebuild and scrub rates (rates.go): spec.rates go to pool.SetVolumeRates the same way
//     (a field of 0: the node's); status.rates, Events RatesSet and RatesFailed.
//   - Scrub schedule (scrubschedule.go): spec.scrubSchedule goes to
//     pool.SetVolumeScrubSchedule the same way (absent: the node's schedule);
//     status.scrubSchedule, Events ScrubScheduleSet and ScrubScheduleFailed.
//
// Spec.layout.chunkSizeBytes goes to pool.CreateOptions.ChunkSize: the array is created with
// that chunk size (recorded in its superblocks; pool.VolumeInfo.ChunkSize reports it).
//
// # Raid10Node (named NodeName)
//
// Created when missing. Status: every disk of the pool except replaced (Removed) ones, with
// ID (serial or WWN, else the pool's disk UUID, else the path), path, size, state (Active
// and Spare are Healthy, Missing is Missing, Failed and Refused are Failed, with the reason
// in the message) and free bytes (pool.MemberFree: the data one new member extent on the
// disk can hold, 0 for spares), the disk counts, capacity (raw and usable from
// pool.Capacity; free is pool.Capacity.LargestVolume, the largest volume that can be
// created now over all Active disks) and conditions Ready (PoolOpen) and DisksHealthy.
//
// # Disk replacement (Raid10Node spec.diskReplacement)
//
// An operator (kubectl raid10 replace-disk) sets spec.diskReplacement: oldDisk (an id of
// status.disks, or a path) and newPath, optionally wipe. The agent acts once per
// metadata.generation: pool.ReplaceDisk, after which every volume with a member on the old
// disk rebuilds onto the new one (their status.rebuild shows it). The outcome goes to
// status.lastDiskReplacement (observedGeneration, result Succeeded or Failed, the new
// disk's id, a message naming the rebuilding volumes or the refusal) and to an Event,
// DiskReplaced or DiskReplaceFailed. A refused request (unknown disk, a disk still Healthy,
// a new disk that carries a signature without wipe) changes nothing and is not retried;
// setting the spec again asks again. A request whose outcome was not written before a
// restart is found done (old disk Removed, new disk in the pool) and reported Succeeded.
//
// # Following the pool within 2 seconds
//
// A poller calls pool.Status every Options.PollInterval (1 s) and compares a fingerprint of
// each volume (size, health, member states, bad and lost blocks, member timeouts, sync kind
// and whole percent) and of the node
// (capacity, disk states and free bytes) with the last one; a change enqueues that object
// through a source.Channel. A disk failure therefore shows in the status within one poll
// interval plus one API round trip; a rebuild writes the status about once per percent.
// The agent's own status writes do not trigger reconciles (the watch predicates pass only
// generation, deletion and finalizer changes), so there is no write loop.
//
// # Events
//
// Through an events.k8s.io recorder (component raid10.csi.io/node-agent), on the Raid10Volume:
// Provisioned, ProvisioningFailed, Degraded, VolumeFailed, RebuildStarted, RebuildFinished,
// Expanded, ExpansionFailed, ExtentsFreed, DeleteFailed, and BadBlocks (Warning, when the
// bad or lost block count grows, with both counts before and after and each member's);
// on the Raid10Node: DiskFailed,
// DiskHealthy, DiskReplaced and DiskReplaceFailed. They fire on transitions of what the
// agent last reported (seeded from the object's status when the agent starts, so a restart
// does not repeat them); the replacement Events fire once per request.
//
// # RBAC
//
// raid10volumes: get, list, watch, update (the finalizer); raid10volumes/status: update;
// raid10nodes: get, list, watch, create; raid10nodes/status: update; and events in the
// events.k8s.io group (not only the core group): create, patch.
//
// # Errors and concurrency
//
// Transient errors (the API server, pool I/O) are returned to controller-runtime, which
// retries with backoff and logs them; a write conflict from a stale cache requeues quietly.
// Everything else is logged with klog structured logging (keys volumeID, nodeID). Each
// controller runs one worker, so operations on one object never overlap; the pool
// serialises its own label updates.
package agent
