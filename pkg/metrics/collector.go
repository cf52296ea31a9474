package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// Namespace prefixes every metric name.
const Namespace = "raid10"

// Source is what the pool collector reads at scrape time. *pool.Pool implements it.
type Source interface {
	// Status snapshots the pool: capacity, disks, volumes with health and sync progress.
	Status() pool.Status
	// Array returns a volume's array, whose Status carries the I/O counters; an error
	// (the volume was deleted since Status, or is not assembled) skips the volume.
	Array(name string) (*raid10.Array, error)
}

var _ Source = (*pool.Pool)(nil)

// PoolCollector is a prometheus.Collector that reads a pool snapshot on every scrape. It
// keeps no state and adds nothing to the I/O path: the counters are the engine's own.
type PoolCollector struct {
	src       Source
	mapperDir string // where encrypted volumes' dm-crypt mappings appear; "": /dev/mapper
}

var _ prometheus.Collector = (*PoolCollector)(nil)

// NewPoolCollector returns a collector for src.
func NewPoolCollector(src Source) *PoolCollector { return &PoolCollector{src: src} }

// WithMapperDir makes the collector look for encrypted volumes' dm-crypt mappings
// (volume_encrypted) in dir instead of /dev/mapper; for tests.
func (c *PoolCollector) WithMapperDir(dir string) *PoolCollector {
	c.mapperDir = dir
	return c
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

var (
	volReadOps    = desc("volume_read_ops_total", "Read requests the volume's array completed.", "volume")
	volWriteOps   = desc("volume_write_ops_total", "Write requests the volume's array completed.", "volume")
	volReadBytes  = desc("volume_read_bytes_total", "Bytes read from the volume's array.", "volume")
	volWriteBytes = desc("volume_write_bytes_total", "Bytes written to the volume's array.", "volume")
	volSize       = desc("volume_size_bytes", "Usable size of the volume.", "volume")
	volHealth     = desc("volume_health", "Health of the volume: 1 for the current state, 0 for the others.", "volume", "health")
	volMembers    = desc("volume_members", "Member slots of the volume.", "volume")
	volInSync     = desc("volume_members_in_sync", "Members of the volume in sync.", "volume")
	volSyncRatio  = desc("volume_sync_progress_ratio", "Progress of a running rebuild, resync or scrub, 0 to 1; absent when none runs.", "volume", "kind")
	volSyncRate   = desc("volume_sync_rate_bytes_per_second", "Recent copy rate of a running rebuild, resync or scrub.", "volume", "kind")
	volSyncLeft   = desc("volume_sync_remaining_bytes", "Bytes a running rebuild, resync or scrub has still to visit.", "volume", "kind")
	volSyncETA    = desc("volume_sync_eta_seconds", "Estimated seconds left for a running rebuild, resync or scrub at the recent rate (0: unknown).", "volume", "kind")
	memErrors     = desc("volume_member_io_errors_total", "I/O errors of one member of a volume; sum by (disk) for a disk's errors.", "volume", "member", "disk", "op")
	volBadBlocks  = desc("volume_bad_blocks", "Blocks (4 KiB) recorded bad, summed over the members; each is still read from its other copy unless lost.", "volume")
	volLostBlocks = desc("volume_lost_blocks", "Blocks bad on every copy: reads there fail with an I/O error until the block is written again.", "volume")
	memBadBlocks  = desc("volume_member_bad_blocks", "Blocks recorded bad on one member of a volume; sum by (disk) for a disk.", "volume", "member", "disk")
	memTimeouts   = desc("volume_member_timeouts_total", "Requests of one member of a volume that passed the member deadline (--member-timeout); each fails the member.", "volume", "member", "disk")
	memSlowLast   = desc("volume_member_slow_last_copy_total", "Stalls past the member deadline of one member of a volume that were waited for, not failed: it held the last in-sync copy of some chunk, or the other copy was late too.", "volume", "member", "disk")
	volScrubMism  = desc("volume_scrub_mismatches_total", "Blocks (4 KiB) whose two copies a scrub (check or repair) found different, summed over every scrub since the plugin started.", "volume")
	volScrubLast  = desc("volume_scrub_last_completed_timestamp_seconds", "When a scrub of the volume last reached its end (Unix time); absent before the first since the plugin started.", "volume")
	memState      = desc("volume_member_state", "State of one member of a volume (engine's view): 1 for the current state.", "volume", "member", "state")
	volHydCopied  = desc("volume_hydration_copied_bytes", "Bytes a restored or cloned volume has copied from its source; absent for a volume made blank.", "volume")
	volEncrypted  = desc("volume_encrypted", "1 while the volume is staged on this node through its dm-crypt (LUKS2) mapping, so that its disks get ciphertext only; 0 otherwise: a plain volume, or an encrypted one not staged now (the Raid10Volume says what its StorageClass asked).", "volume")
	volHydrated   = desc("volume_hydrated", "1 once a restored or cloned volume has copied all of its source (it no longer needs it), else 0; absent for a volume made blank.", "volume")
	snapSize      = desc("snapshot_size_bytes", "Size of a snapshot: its source's size at the cut.", "snapshot", "source")
	snapCopied    = desc("snapshot_copied_bytes", "Bytes of a snapshot copied into its own extents; equal to its size once ready.", "snapshot", "source")
	snapReady     = desc("snapshot_ready", "1 once the snapshot's copy is complete (ready to use, independent of its source), else 0.", "snapshot", "source")
	snapCut       = desc("snapshot_cut_timestamp_seconds", "The point in time a snapshot holds (Unix time of its cut).", "snapshot", "source")
	snapHealth    = desc("snapshot_health", "Health of a snapshot's own mirrored extents: 1 for the current state, 0 for the others.", "snapshot", "health")
	diskInfo      = desc("disk_info", "A disk of the pool (always 1), joining its UUID to path and identity.", "disk", "path", "identity")
	diskState     = desc("disk_state", "State of a disk: 1 for the current state, 0 for the others.", "disk", "state")
	diskSize      = desc("disk_size_bytes", "Size of a disk.", "disk")
	diskFree      = desc("disk_free_bytes", "Free bytes of a disk's data area.", "disk")
	poolRaw       = desc("pool_raw_bytes", "Data area of the Active disks.", "pool")
	poolUsable    = desc("pool_usable_bytes", "Usable capacity after mirroring (raw/2).", "pool")
	poolFreeRaw   = desc("pool_free_raw_bytes", "Free part of the raw capacity.", "pool")
	poolFreeUse   = desc("pool_free_usable_bytes", "Free usable capacity after mirroring.", "pool")
	poolLargest   = desc("pool_largest_volume_bytes", "Size of the largest volume that can be created now.", "pool")
	poolSpare     = desc("pool_spare_bytes", "Data area of the hot spares.", "pool")
)

var (
	healthStates = []pool.Health{pool.Healthy, pool.Degraded, pool.Rebuilding, pool.Failed}
	diskStates   = []pool.DiskStatus{pool.StatusActive, pool.StatusSpare, pool.StatusFailed, pool.StatusRemoved, pool.StatusMissing, pool.StatusRefused}
	memberStates = []raid10.MemberState{raid10.MemberInSync, raid10.MemberRecovering, raid10.MemberFaulty, raid10.MemberMissing}
)

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		volReadOps, volWriteOps, volReadBytes, volWriteBytes, volSize, volHealth, volMembers, volInSync,
		volSyncRatio, volSyncRate, volSyncLeft, volSyncETA, memErrors, memState,
		volBadBlocks, volLostBlocks, memBadBlocks, memTimeouts, memSlowLast, volScrubMism, volScrubLast,
		volHydCopied, volHydrated, volEncrypted, snapSize, snapCopied, snapReady, snapCut, snapHealth,
		diskInfo, diskState, diskSize, diskFree,
		poolRaw, poolUsable, poolFreeRaw, poolFreeUse, poolLargest, poolSpare,
	} {
		ch <- d
	}
	for _, d := range limitDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Status()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	b := func(ok bool) float64 {
		if ok {
			return 1
		}
		return 0
	}

	pn := st.Name
	gauge(poolRaw, float64(st.Capacity.Raw), pn)
	gauge(poolUsable, float64(st.Capacity.Usable), pn)
	gauge(poolFreeRaw, float64(st.Capacity.FreeRaw), pn)
	gauge(poolFreeUse, float64(st.Capacity.FreeUsable), pn)
	gauge(poolLargest, float64(st.Capacity.LargestVolume), pn)
	gauge(poolSpare, float64(st.Capacity.Spare), pn)

	seen := map[string]bool{}
	for _, d := range st.Disks {
		id := diskLabel(d)
		if seen[id] {
			continue // two series with one label set would fail the whole scrape
		}
		seen[id] = true
		gauge(diskInfo, 1, id, d.Path, d.Identity)
		for _, s := range diskStates {
			gauge(diskState, b(d.Status == s), id, string(s))
		}
		gauge(diskSize, float64(d.Size), id)
		gauge(diskFree, float64(d.Free), id)
	}

	for _, sn := range st.Snapshots {
		gauge(snapSize, float64(sn.Size), sn.Name, sn.Source)
		gauge(snapCopied, float64(sn.Copied), sn.Name, sn.Source)
		gauge(snapReady, b(sn.Ready), sn.Name, sn.Source)
		gauge(snapCut, float64(sn.CutAt.UnixNano())/1e9, sn.Name, sn.Source)
		for _, h := range healthStates {
			gauge(snapHealth, b(sn.Health == h), sn.Name, string(h))
		}
	}

	for _, v := range st.Volumes {
		gauge(volSize, float64(v.Size), v.Name)
		gauge(volEncrypted, b(crypt.VolumeOpen(c.mapperDir, v.Name)), v.Name)
		if v.Source != nil {
			gauge(volHydCopied, float64(v.Copied), v.Name)
			gauge(volHydrated, b(v.Hydrated), v.Name)
		}
		for _, h := range healthStates {
			gauge(volHealth, b(v.Health == h), v.Name, string(h))
		}
		gauge(volMembers, float64(len(v.Members)), v.Name)
		gauge(volInSync, float64(v.InSync), v.Name)
		if p := v.Sync; p != nil {
			ratio := 0.0
			if p.Total > 0 {
				ratio = float64(p.Done) / float64(p.Total)
			}
			gauge(volSyncRatio, ratio, v.Name, p.Kind)
			gauge(volSyncRate, p.Rate, v.Name, p.Kind)
			gauge(volSyncLeft, float64(max(p.Total-p.Done, 0)), v.Name, p.Kind)
			gauge(volSyncETA, p.ETA.Seconds(), v.Name, p.Kind)
		}
		var mism int64
		if sc := v.Scrub; sc != nil {
			mism = sc.MismatchesTotal
			if sc.LastCompleted != nil {
				gauge(volScrubLast, float64(sc.LastCompleted.UnixNano())/1e9, v.Name)
			}
		}
		counter(volScrubMism, uint64(mism), v.Name)
		gauge(volBadBlocks, float64(v.BadBlocks), v.Name)
		gauge(volLostBlocks, float64(v.LostBlocks), v.Name)
		for _, m := range v.Members {
			slot := strconv.Itoa(m.Role)
			for _, s := range memberStates {
				gauge(memState, b(m.State == s.String()), v.Name, slot, s.String())
			}
			gauge(memBadBlocks, float64(m.BadBlocks), v.Name, slot, m.DiskUUID)
			counter(memTimeouts, m.TimedOut, v.Name, slot, m.DiskUUID)
			counter(memSlowLast, m.SlowLastCopy, v.Name, slot, m.DiskUUID)
		}
		arr, err := c.src.Array(v.Name)
		if err != nil {
			continue // deleted since the snapshot, or not assembled: no counters
		}
		as := arr.Status()
		counter(volReadOps, as.ReadOps, v.Name)
		counter(volWriteOps, as.WriteOps, v.Name)
		counter(volReadBytes, as.ReadBytes, v.Name)
		counter(volWriteBytes, as.WriteBytes, v.Name)
		collectLimits(ch, v.Name, as)
		for _, m := range as.Members {
			disk := ""
			if m.Slot < len(v.Members) {
				disk = v.Members[m.Slot].DiskUUID
			}
			slot := strconv.Itoa(m.Slot)
			counter(memErrors, m.ReadErrors, v.Name, slot, disk, "read")
			counter(memErrors, m.WriteErrors, v.Name, slot, disk, "write")
		}
	}
}

// diskLabel is the disk label value: the pool's disk UUID, or the path of a disk that has
// none (refused).
func diskLabel(d pool.DiskInfo) string {
	if d.UUID != "" {
		return d.UUID
	}
	return d.Path
}
