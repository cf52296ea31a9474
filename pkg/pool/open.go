package pool

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// Open claims the configured disks and assembles every volume found in their labels.
// A disk that cannot be claimed (a foreign signature, a corrupt label, another pool's label,
// in use by another process) does not fail Open: it is listed by Disks with State Refused
// and the reason. Open fails for an invalid configuration or when the disks carry labels of
// several pools and Config.PoolUUID does not say which one is this node's.
func Open(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := newPool(cfg.withDefaults())
	recs, err := loadDisksFile(p.cfg.DisksFile)
	if err != nil {
		return nil, err
	}
	p.records = recs

	// 1. Open every disk and read its label.
	probes := p.probeDisks()
	// 2. Which pool is this node's?
	if err := p.choosePool(probes); err != nil {
		closeProbes(probes)
		return nil, err
	}
	// 3. Adopt this pool's disks; the label with the highest pool epoch holds the table.
	newest := p.adoptLabels(probes)
	probes = p.adoptTable(newest, refuseClones(probes), probes)
	p.gatherTombstones()
	// 4. Open the data path of the present disks.
	p.openDataPaths()
	// 5. Claim blank disks (and, with wipe, refused ones), then bring every present label up
	// to the table (a disk that missed an update while it was away gets the current table).
	p.claimBlank(probes)
	p.releaseRefused()
	if err := p.writeTable(p.markAway()); err != nil {
		p.closeDisks()
		return nil, err
	}
	// 6. Assemble the volumes; spares take over disks recorded as failed. (A missing disk
	// is waited for instead: when it returns it resyncs only what changed.)
	p.assembleAll()
	if p.pruneTombstones() {
		if err := p.writeTable(false); err != nil {
			klog.ErrorS(err, "Writing the pruned tombstone list")
		}
	}
	p.resumeCopies()
	// The copiers run from here on, and their callbacks write labels under p.mu: the spare
	// takeovers hold it too (two label writes on one disk at once would pick the same slot).
	p.mu.Lock()
	p.replaceFailed()
	p.clearAway()
	p.mu.Unlock()

	klog.InfoS("Pool open", "pool", p.uuid, "name", p.name, "disks", len(p.disks), "volumes", len(p.volumes))
	go p.monitor()
	go p.scheduler()
	return p, nil
}

// newPool is a pool of no disks yet, with the configuration's name.
func newPool(cfg Config) *Pool {
	return &Pool{
		cfg:     cfg,
		name:    cfg.Name,
		volumes: map[UUID]*volume{},
		byName:  map[string]*volume{},
		snaps:   map[string]*volume{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),

		events:     make(chan Event, eventBuffer),
		lastHealth: map[UUID]Health{},
		scrubs:     map[UUID]*scrubRun{},
		lastWindow: map[UUID]time.Time{},
		now:        time.Now,
		restored:   map[UUID]time.Time{},
	}
}

// probe is what Open learnt about one disk before adopting it.
type probe struct {
	d      *disk
	blank  bool // to be claimed: no label, or one that wipe allows to erase
	labels labelSlots
}

// probeDisks opens every configured disk and every one Config.DisksFile records (p.records),
// and reads its label.
func (p *Pool) probeDisks() []*probe {
	all := append([]DiskConfig(nil), p.cfg.Disks...)
	for _, r := range p.records {
		all = append(all, DiskConfig{Path: r.Path, recorded: true})
	}
	var probes []*probe
	for _, dc := range expandDisks(all) {
		probes = append(probes, p.probeDisk(dc))
	}
	return probes
}

// probeDisk opens one disk and reads its label; a disk that cannot be opened or whose label
// cannot be read (and that may not be wiped) is refused.
func (p *Pool) probeDisk(dc DiskConfig) *probe {
	d := &disk{path: dc.Path, cfg: dc, listed: true}
	pr := &probe{d: d}
	f, err := p.openDisk(dc.Path)
	if err != nil {
		d.refused = err
		return pr
	}
	d.file, d.size, d.ident = f, uint64(f.size), f.ident.String()
	pr.labels = readLabel(f.f)
	switch err := pr.labels.err(); {
	case err == nil:
	case dc.recorded:
		// The file only brings back disks the pool claimed: a blank or unreadable one there
		// now (a crash before its claim, a disk swapped under the path) is not taken.
		d.refused = fmt.Errorf("%w: disk %s is recorded in disksFile %s but carries no readable pool label (%w); not claimed: offer it with disk add to claim it",
			ErrFailedPrecondition, dc.Path, p.cfg.DisksFile, err)
	case errors.Is(err, errNoLabel):
		pr.blank = true
	default:
		if dc.Wipe {
			pr.blank = true
			break
		}
		d.refused = fmt.Errorf("pool: refusing disk %s: %w (set wipe for this disk to erase it)", dc.Path, err)
	}
	return pr
}

// closeProbes closes every disk Open opened.
func closeProbes(probes []*probe) {
	for _, pr := range probes {
		if pr.d.file != nil {
			_ = pr.d.file.close()
		}
	}
}

// choosePool sets p.uuid: Config.PoolUUID, else the one pool whose labels the disks carry,
// else a new pool. The configured disks say; the recorded ones only when no configured disk
// carries a label. Labels of several pools without Config.PoolUUID are ErrMixedPools.
func (p *Pool) choosePool(probes []*probe) error {
	if p.cfg.PoolUUID != "" {
		p.uuid, _ = ParseUUID(p.cfg.PoolUUID) // validated
		return nil
	}
	pools := labelledPools(probes, false)
	if len(pools) == 0 {
		pools = labelledPools(probes, true)
	}
	switch len(pools) {
	case 0:
		p.uuid = NewUUID()
	case 1:
		for u := range pools {
			p.uuid = u
		}
	default:
		var parts []string
		for u, paths := range pools {
			parts = append(parts, fmt.Sprintf("pool %s on %s", u, strings.Join(paths, ", ")))
		}
		sort.Strings(parts)
		return fmt.Errorf("%w: %s; set poolUUID to choose", ErrMixedPools, strings.Join(parts, "; "))
	}
	return nil
}

// labelledPools maps each pool whose label a readable disk carries to those disks' paths:
// of the configured disks, or with recorded of those Config.DisksFile records.
func labelledPools(probes []*probe, recorded bool) map[UUID][]string {
	pools := map[UUID][]string{}
	for _, pr := range probes {
		if l := pr.labels.label; l != nil && pr.d.refused == nil && pr.d.cfg.recorded == recorded {
			pools[l.Pool] = append(pools[l.Pool], pr.d.path)
		}
	}
	return pools
}

// adoptLabels makes the disks that carry this pool's label present (another pool's label is
// refused, or with wipe to be claimed) and returns the label with the highest pool epoch,
// whose table and name the pool takes; nil when no disk carries this pool's label.
func (p *Pool) adoptLabels(probes []*probe) *Label {
	var newest *Label
	for _, pr := range probes {
		d, l := pr.d, pr.labels.label
		if d.refused != nil || l == nil {
			continue
		}
		if l.Pool != p.uuid {
			if d.cfg.Wipe {
				pr.blank = true
				continue
			}
			d.refused = fmt.Errorf("%w: disk %s carries the label of pool %s (%q), this node's pool is %s",
				ErrOtherPool, d.path, l.Pool, l.PoolName, p.uuid)
			continue
		}
		d.uuid, d.label, d.slot, d.present = l.Disk, l, pr.labels.slot, true
		if newest == nil || l.PoolEpoch > newest.PoolEpoch {
			newest = l
		}
	}
	if newest != nil {
		p.epoch, p.name = newest.PoolEpoch, newest.PoolName
	}
	return newest
}

// refuseClones refuses every present disk whose disk UUID an earlier one carries (a dd of a
// member: refuse the second, never guess) and returns the present disks by UUID.
func refuseClones(probes []*probe) map[UUID]*disk {
	byUUID := map[UUID]*disk{}
	for _, pr := range probes {
		d := pr.d
		if !d.present {
			continue
		}
		if other := byUUID[d.uuid]; other != nil {
			d.present, d.label = false, nil
			d.refused = fmt.Errorf("%w: disk %s carries the same disk UUID %s as %s", ErrFailedPrecondition, d.path, d.uuid, other.path)
			continue
		}
		byUUID[d.uuid] = d
	}
	return byUUID
}

// adoptTable takes each present disk's state and identity from the table of the newest
// label, adds the disks the table names that are not present (missing), and makes the
// probed disks and the missing ones p.disks. It returns probes with the missing disks added.
func (p *Pool) adoptTable(newest *Label, present map[UUID]*disk, probes []*probe) []*probe {
	if newest != nil {
		for _, e := range newest.Disks {
			away := e.Flags&DiskFlagAway != 0
			if d := present[e.UUID]; d != nil {
				d.state, d.ident, d.away = e.State, firstNonEmpty(d.ident, e.Identity), away
				continue
			}
			d := &disk{uuid: e.UUID, state: e.State, ident: e.Identity, size: e.Size, away: away}
			present[e.UUID] = d
			probes = append(probes, &probe{d: d})
		}
	}
	for _, pr := range probes {
		d := pr.d
		if d.present && d.state == 0 {
			d.state = DiskActive // labelled but not yet in the table: a crash during a claim
		}
		p.disks = append(p.disks, d)
	}
	return probes
}

// openDataPaths opens the data path of every present disk; a disk whose data path cannot
// be opened is refused.
func (p *Pool) openDataPaths() {
	for _, d := range p.disks {
		if !d.present {
			continue
		}
		if err := d.openBase(); err != nil {
			klog.ErrorS(err, "Disk data path unusable", "disk", d.path)
			d.present = false
			d.refused = err
		}
	}
}

// openBase opens the disk's data path (direct I/O where the file system allows it) and
// moves the disk's lock from the label's open file to the data path's. The data path is
// where member I/O goes, and a lock held by an open file lasts until the last call in flight
// on that file has returned (raid10.FileMember.LockExclusive): a write abandoned in a hung
// disk (the member deadline gave up on it) keeps the disk locked after Close and after this
// process has exited, until it lands. A successor's Open then refuses the disk as in use
// and serves its volumes from the other copies (retryInUse brings it back once it is free),
// instead of writing beside a stale write that would land later. The move leaves a moment
// with no lock: a process that takes it then makes this open fail, which refuses the disk
// here, never both.
func (d *disk) openBase() error {
	if d.file.mem != nil {
		// A disk of Config.OpenDisk: its member is the data path too, with no lock to move.
		d.base, d.file.memBase = d.file.mem, true
		return nil
	}
	m, err := raid10.OpenFileMember(d.file.real)
	if err != nil {
		return fmt.Errorf("pool: open data path of %s: %w", d.path, err)
	}
	if err := d.file.unlock(); err != nil {
		_ = m.Close()
		return fmt.Errorf("pool: unlock label path of %s: %w", d.path, err)
	}
	if err := m.LockExclusive(); err != nil {
		_ = m.Close()
		return fmt.Errorf("%w: disk %s was locked by another process while its data path opened: %w", ErrDiskInUse, d.path, err)
	}
	d.base = m
	if wrapDiskBase != nil {
		d.base = wrapDiskBase(d.path, m)
	}
	return nil
}

// wrapDiskBase, set by tests before Open, wraps the data path of every disk the pool opens
// (the pool fault matrix puts a volatile write cache there, which its simulated crashes
// drop). Labels do not go through it.
var wrapDiskBase func(path string, m raid10.Member) raid10.Member

// claimBlank claims the blank disks (and, with wipe, the refused ones); a disk that cannot
// be claimed is refused.
func (p *Pool) claimBlank(probes []*probe) {
	for _, pr := range probes {
		if !pr.blank {
			continue
		}
		if err := p.claim(pr.d); err != nil {
			klog.ErrorS(err, "Disk not claimed", "disk", pr.d.path)
			pr.d.refused = err
		}
	}
}

// releaseRefused closes the refused disks and logs why each was refused.
func (p *Pool) releaseRefused() {
	for _, d := range p.disks {
		if d.refused == nil {
			continue
		}
		if d.file != nil {
			_ = d.file.close()
			d.file = nil
		}
		klog.ErrorS(d.refused, "Disk refused", "disk", d.path)
	}
}

// replaceFailed lets a hot spare take over each disk recorded as failed. Caller holds p.mu.
func (p *Pool) replaceFailed() {
	for _, d := range p.disks {
		if d.state == DiskFailed {
			p.useSpare(d)
		}
	}
}
