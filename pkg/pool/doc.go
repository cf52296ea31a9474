// Package pool is a node's disk pool: the local disks it was given, the pool label on each,
// and the RAID10 volumes carved from them, one pkg/raid10 array per volume over one extent
// on each of its member disks.
//
// # Disks
//
// Disks come from Config: device paths, globs (/dev/disk/by-id/nvme-*) or regular files. A
// disk is claimed only when it is blank — DetectSignatures finds no partition table,
// filesystem, RAID or LVM signature, checking the magic numbers itself so that no tool is
// needed — or when it already carries this pool's label. Anything else is refused, untouched,
// with the device and the signature named (SignatureError); DiskConfig.Wipe is the explicit,
// per-disk opt-in to erase it. A disk is recognised by the disk UUID in its label wherever
// it appears; its serial or WWN (sysfs, /dev/disk/by-id) is recorded for operators. A disk
// given at run time (AddDisk, ReplaceDisk) on a path the list does not cover is recorded in
// Config.DisksFile before it is claimed, and Open takes the recorded paths as listed — only
// disks carrying a label: the file never makes the pool claim a blank disk.
//
// # Pool label
//
// The first LabelAreaSize (1 MiB) of every disk holds the label, twice (slots at 0 and
// 256 KiB, crc32c, the higher valid generation wins): pool UUID and name, disk UUID, data
// area, the pool's disk table (every disk's UUID, state and identity) and this disk's
// extent table (volume UUID, name, size, member count, role, epoch, offset, length), and
// the pool's tombstones (the UUIDs of deleted objects that a disk away at the delete may
// still hold: no assembly path brings them back, see tombstone.go). The byte map is in
// docs/on-disk-format.md, section "Pool label". A label is never overwritten in place:
// the new image goes to the other slot and is synced first.
//
// # Volumes
//
// CreateVolume allocates one extent per member disk (first fit or best fit, aligned),
// creates the array, then records the extents in the labels. Open reassembles every
// volume from the labels: per role the entry with the highest epoch wins, roles on
// missing or failed disks are left out and the volume starts Degraded. Usable capacity
// follows md's near-2 layout: N members with extents of E bytes hold N*E/2.
//
// # Failures
//
// A disk fails by operator request (FailDisk) or when the engine fails its member on an
// I/O error (noticed by a monitor); every volume on it goes Degraded and a hot spare, if
// configured, takes over. ReplaceDisk rebuilds every affected volume onto a new disk, with
// progress in VolumeInfo.Sync. A missing disk that returns (AddDisk, or the next Open) is
// re-added and resyncs only the regions its absence left dirty (the engine's bitmap).
// The extents of a volume's roles on failed (or replaced) disks still present are the
// engine's witnesses at every assembly (raid10.AssembleOptions.Witnesses): a member that
// missed writes one of them took is never served as in sync, so a volume whose current
// copy is only on a failed disk is Failed rather than served stale, and ReplaceDisk
// refuses that disk until it is re-added and the volume rebuilt from it; so does a
// replace (or a spare's takeover) while a volume's member on the disk is still in service
// (the engine keeps a last in-sync copy), checked for every volume before any changes. A
// disk away at a
// start is flagged in the disk table (DiskFlagAway, away.go) until every volume on it has
// been assembled with it again: its members are not trusted alone in their mirror, since
// only their absent partners would know what they missed.
// A member request past Config.MemberTimeout fails the member, and so the disk, the same
// way. Blocks the engine records bad (VolumeInfo.BadBlocks; LostBlocks where no copy is
// readable) fail no disk but keep the volume Degraded until they are written again.
//
// # Snapshots, restores and clones
//
// CreateSnapshot makes a snapshot of a volume: an array of the pool as large as the volume,
// never served, filled with the volume's data as of the cut by the engine's Copy (a
// copy-before-write hook on the volume, a rate-limited background copier, a resumable
// bitmap in the copy record at the snapshot array's reserved tail). CreateVolume with a
// Source restores a snapshot or clones a volume the same way into a served volume, usable at
// once (uncopied regions are copied on access). Extent flags record the relation (snapshot,
// copy target, copying, copy failed; the source's UUID prefix), so Open puts the hooks back
// before anything is served. A copy target whose copy failed, or is unfinished and cannot
// run, is never served, whichever path assembles it (admit and servable, service.go). A
// finished copy depends on nothing. See docs/design.md,
// "Snapshots, clones and restores".
//
// # Scrub
//
// StartScrub runs the engine's check or repair of a volume in the background (StopScrub
// pauses it); its state and counts are in VolumeInfo.Scrub. A scheduler (Config.Scrub,
// md's first-Sunday monthly check in a nightly window by default) starts checks, pauses
// those its window ends and continues them the next night until each volume is checked
// once per cycle. A paused check resumes where it stopped (the engine's CheckRange and
// RepairRange); a new cycle starts from the beginning.
//
// Events (disk failed, disk replaced, volume health changes, scrub results) arrive on Pool.Events within
// a monitor tick; Pool.Status is the full snapshot. Pool.Check proves the labels and the
// arrays consistent (tests end every fault scenario with it).
//
// Errors wrap the sentinels in errors.go; callers map them once, with errors.Is.
package pool
