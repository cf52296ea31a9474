package pool

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// minDataArea is the smallest data area a disk must offer to be claimed.
const minDataArea = 16 << 20

// Pool is a node's disk pool: the disks it claimed and the RAID10 volumes carved from them.
// All methods are safe for concurrent use; operations that change labels are serialised.
type Pool struct {
	cfg Config

	mu         sync.Mutex // guards everything below and serialises label updates
	uuid       UUID
	name       string
	epoch      uint64 // pool epoch: raised on every change of the disk table
	disks      []*disk
	volumes    map[UUID]*volume
	byName     map[string]*volume
	snaps      map[string]*volume // snapshots by name (also in volumes, never in byName)
	closed     bool
	stop       chan struct{}
	done       chan struct{}
	events     chan Event
	lastHealth map[UUID]Health // monitor: health last reported per volume
	scrubs     map[UUID]*scrubRun
	lastWindow map[UUID]time.Time // scheduler: the cycle each volume's last scheduled scrub began in
	now        func() time.Time   // the scheduler's clock (tests set it)
	restored   map[UUID]time.Time // RecordScrubCompleted: last scrub completions from before Open
	records    []diskRecord       // Config.DisksFile: disks given at run time on unlisted paths
	tombs      []Tombstone        // deleted objects (tombstone.go); every label write carries them

	// failpoint, set by tests, is called at every durability ordering point; an error makes
	// the operation stop there as if the process had died.
	failpoint func(name string) error
	// wrapMember, set by tests, wraps the member extent of each role CreateVolume makes (a
	// raid10.FaultyMember, to make blocks unreadable or a disk stall).
	wrapMember func(raid10.Member) raid10.Member
}

// disk is a disk known to the pool: claimed and present, in the table but missing, or
// offered and refused.
type disk struct {
	uuid    UUID
	path    string
	cfg     DiskConfig
	file    *diskFile     // nil when missing or refused
	base    raid10.Member // data I/O on the whole disk; nil when missing or refused
	label   *Label        // current label; nil when missing or refused
	slot    int           // label slot holding label
	state   DiskState     // from the disk table
	present bool          // opened and carries this pool's label
	refused error         // why the disk was not claimed
	ident   string        // identity from the table (serial/WWN)
	listed  bool          // the configuration's disk list or Config.DisksFile names it (else a restart will not find it)
	size    uint64
	away    bool // DiskFlagAway: the pool ran without it; its members may be stale (doubtful)
}

// usable reports whether the disk may hold live extents now.
func (d *disk) usable() bool { return d.present && d.state == DiskActive }

// claim makes a blank (or wipe-enabled) disk a member of the pool: it checks for foreign
// signatures, wipes them when allowed, and writes a fresh label. Caller holds p.mu or is
// Open.
func (p *Pool) claim(d *disk) error {
	f := d.file
	sigs, err := DetectSignatures(f.f, f.size)
	if err != nil {
		return err
	}
	if len(sigs) > 0 && !d.cfg.Wipe {
		return &SignatureError{Disk: d.path, Found: sigs}
	}
	a := uint64(p.cfg.Alignment)
	start, end := alignUp(LabelAreaSize, a), alignDown(uint64(f.size), a)
	if end < start+minDataArea {
		return fmt.Errorf("%w: disk %s: %d bytes, too small for the pool (at least %d)",
			ErrInvalidArgument, d.path, f.size, start+minDataArea)
	}
	if d.cfg.Wipe {
		klog.InfoS("Wiping disk as configured", "disk", d.path, "signatures", fmt.Sprint(sigs))
		if err := f.wipeSignatures(); err != nil {
			return err
		}
	}
	if n := len(p.disks); n > MaxDisks {
		return fmt.Errorf("%w: the pool holds at most %d disks", ErrInvalidArgument, MaxDisks)
	}
	if d.uuid.IsZero() { // AddDisk and ReplaceDisk choose it first, to record it
		d.uuid = NewUUID()
	}
	d.state = DiskActive
	if d.cfg.Spare {
		d.state = DiskSpare
	}
	d.size = uint64(f.size)
	d.label = &Label{
		Pool: p.uuid, Disk: d.uuid, PoolName: p.name, DiskSize: d.size,
		DataStart: start, DataEnd: end, Alignment: uint32(a),
	}
	d.slot = 1 // the first write goes to slot 0
	d.present, d.refused = true, nil
	if err := d.openBase(); err != nil {
		d.present = false
		return err
	}
	p.epoch++
	if err := p.writeLabel(d, nil); err != nil {
		d.present = false
		return err
	}
	klog.InfoS("Disk claimed", "disk", d.path, "diskUUID", d.uuid, "state", d.state, "identity", d.ident)
	return nil
}

// table is the pool's disk table as written into every label.
func (p *Pool) table() []DiskEntry {
	var t []DiskEntry
	for _, d := range p.disks {
		if d.uuid.IsZero() || d.state == 0 {
			continue
		}
		var flags DiskFlags
		if d.away {
			flags |= DiskFlagAway
		}
		t = append(t, DiskEntry{UUID: d.uuid, State: d.state, Flags: flags, Size: d.size, Identity: d.ident})
	}
	return t
}

// writeLabel writes the disk's label with the current table after applying mutate to a
// copy of its extents. Durability order: the new image goes to the slot that does not hold
// the current label and is synced before the in-memory label changes; the current slot is
// never overwritten, so a crash leaves either the old or the new label valid.
func (p *Pool) writeLabel(d *disk, mutate func(l *Label)) error {
	if !d.present || d.file == nil {
		return fmt.Errorf("%w: disk %s is not present", ErrFailedPrecondition, d.uuid)
	}
	nl := *d.label
	nl.Extents = append([]ExtentEntry(nil), d.label.Extents...)
	if mutate != nil {
		mutate(&nl)
	}
	nl.Generation++
	nl.PoolEpoch = p.epoch
	nl.PoolName = p.name
	nl.Disks = p.table()
	nl.Tombstones = slices.Clone(p.tombs)
	if err := nl.check(); err != nil {
		return fmt.Errorf("pool: refusing to write an inconsistent label to %s: %w", d.path, err)
	}
	b, err := nl.Encode()
	if err != nil {
		return err
	}
	slot := 1 - d.slot
	if err := d.file.writeLabelSlot(slot, b); err != nil {
		return err
	}
	d.label, d.slot = &nl, slot
	return nil
}

// writeTable writes the current table to every present disk that is not failed. With bump
// the pool epoch is raised first (the table changed). A disk whose label write fails is
// marked failed in memory; the error of the first failure is returned.
func (p *Pool) writeTable(bump bool) error {
	if bump {
		p.epoch++
	}
	var first error
	for _, d := range p.disks {
		if !d.present || d.state == DiskFailed || d.state == DiskRemoved {
			continue
		}
		if err := p.writeLabel(d, nil); err != nil {
			klog.ErrorS(err, "Label update failed", "disk", d.path)
			if first == nil {
				first = err
			}
		}
	}
	return first
}

// findDisk resolves an operator's reference to a disk: its UUID, the first 8 hex digits of
// it, its path, or its identity (serial/WWN).
func (p *Pool) findDisk(ref string) (*disk, error) {
	var hits []*disk
	for _, d := range p.disks {
		switch {
		case !d.uuid.IsZero() && (d.uuid.String() == ref || d.uuid.Short() == ref),
			d.path != "" && d.path == ref,
			d.ident != "" && d.ident == ref:
			hits = append(hits, d)
		}
	}
	switch len(hits) {
	case 0:
		return nil, fmt.Errorf("%w: disk %q", ErrNotFound, ref)
	case 1:
		return hits[0], nil
	}
	return nil, fmt.Errorf("%w: disk reference %q is ambiguous", ErrInvalidArgument, ref)
}

// openDiskLocked is findDisk on an open pool: ErrClosed after Close. Caller holds p.mu.
func (p *Pool) openDiskLocked(ref string) (*disk, error) {
	if p.closed {
		return nil, ErrClosed
	}
	return p.findDisk(ref)
}

// listed reports whether the configuration's disk list (globs expanded now) or
// Config.DisksFile names path.
func (p *Pool) listed(path string) bool {
	for _, r := range p.records {
		if r.Path == path {
			return true
		}
	}
	return p.listedInConfig(path)
}

// listedInConfig reports whether the configuration's disk list (globs expanded now) names
// path.
func (p *Pool) listedInConfig(path string) bool {
	for _, dc := range expandDisks(p.cfg.Disks) {
		if dc.Path == path {
			return true
		}
	}
	return false
}

// Close stops the monitor, closes every array cleanly and releases the disks.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.stop)
	p.mu.Unlock()
	<-p.done
	p.stopScrubs()
	p.mu.Lock()
	defer p.mu.Unlock()
	// The arrays close with their copy hooks in place (a write still arriving on a source
	// copies first or fails with ErrClosed, never bypasses the hook); the copiers then end
	// on ErrClosed, and their records resume them at the next Open.
	var first error
	for _, v := range p.volumes {
		if v.arr != nil {
			if err := v.arr.Close(); err != nil && first == nil {
				first = fmt.Errorf("pool: close volume %s: %w", v.name, err)
			}
		}
	}
	p.stopCopies()
	for _, v := range p.volumes {
		v.arr = nil
	}
	p.closeDisks()
	klog.InfoS("Pool closed", "pool", p.uuid)
	return first
}

func (p *Pool) closeDisks() {
	for _, d := range p.disks {
		if d.base != nil {
			_ = d.base.Close()
			d.base = nil
		}
		if d.file != nil {
			_ = d.file.close()
			d.file = nil
		}
	}
}

// monitorInterval is how often the monitor looks for members the engine failed.
const monitorInterval = 250 * time.Millisecond

// monitor notices members that the engine marked faulty on an I/O error, marks their disk
// failed (a disk that fails in one volume is failed for all) and puts in a hot spare; every
// inUseRetryInterval it brings back the disks refused as in use that are free again.
func (p *Pool) monitor() {
	defer close(p.done)
	lastRetry := time.Now()
	p.every(monitorInterval, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.failFaultyLocked()
		if time.Since(lastRetry) >= inUseRetryInterval {
			lastRetry = time.Now()
			p.returnFreedLocked()
		}
		p.observeHealth()
	})
}

// every calls f every interval until the pool stops.
func (p *Pool) every(interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		f()
	}
}

// failFaultyLocked fails the disk of every member the engine marked faulty. Caller holds
// p.mu.
func (p *Pool) failFaultyLocked() {
	for _, v := range p.volumes {
		if v.arr == nil {
			continue
		}
		st := v.arr.Status()
		for _, m := range st.Members {
			if m.State != raid10.MemberFaulty || m.Slot >= len(v.roles) || v.roles[m.Slot] == nil {
				continue
			}
			if d := v.roles[m.Slot].disk; d.state == DiskActive {
				reason := "I/O errors"
				if m.TimedOut > 0 {
					reason = fmt.Sprintf("%d requests passed the member deadline", m.TimedOut)
				}
				klog.InfoS("Disk failed under I/O", "disk", d.path, "diskUUID", d.uuid, "volume", v.name, "member", m.Slot, "reason", reason)
				p.failDiskLocked(d, reason)
			}
		}
	}
}

// fail runs the test failpoint called name.
func (p *Pool) fail(name string) error {
	if p.failpoint == nil {
		return nil
	}
	return p.failpoint(name)
}

// UUID returns the pool's UUID.
func (p *Pool) UUID() UUID { return p.uuid }

// Name returns the pool's name.
func (p *Pool) Name() string { return p.name }
