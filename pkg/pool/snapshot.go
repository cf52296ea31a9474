package pool

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// SnapshotInfo describes one snapshot: a full-size mirrored copy of a volume as of its cut.
type SnapshotInfo struct {
	Name       string    `json:"name"`
	UUID       UUID      `json:"uuid"`
	Source     string    `json:"source"`     // origin volume name at the cut
	SourceUUID UUID      `json:"sourceUUID"` // origin volume UUID
	Size       uint64    `json:"size"`       // bytes, the origin's size at the cut
	CutAt      time.Time `json:"cutAt"`      // the cut (CSI creation_time)
	Ready      bool      `json:"ready"`      // copy complete: an independent thick copy
	Copied     uint64    `json:"copied"`     // bytes copied so far (== Size when Ready)
	Health     Health    `json:"health"`
	Members    int       `json:"members"`
	// Reason says why a snapshot is Failed (its copy failed, or it is not assembled).
	Reason string `json:"reason,omitempty"`
}

// A volume's VolumeInfo.Copied counts the bytes copied from its source (up to the
// source's size; a larger volume's tail reads zero).

// Source names what a new volume is filled from: exactly one of Snapshot (a restore) and
// Volume (a clone, the point in time of the create) is set.
type Source struct {
	Snapshot string `json:"snapshot,omitempty"`
	Volume   string `json:"volume,omitempty"`
}

// CreateSnapshot cuts a snapshot of volume source: an array of the pool as large as the
// volume, over as many members, filled with the volume's data as of the cut. It returns
// once the cut is durable (the copy record is on the snapshot's disks and the volume's
// writes go through the copy-before-write hook); the copy runs in the background at the
// rebuild rate (SnapshotInfo.Ready, Copied). It is idempotent by name: the same name of the
// same source returns the snapshot; another source, or a volume of that name, is
// ErrAlreadyExists. An unknown source is ErrNotFound; no room is ErrNoSpace with nothing
// allocated.
func (p *Pool) CreateSnapshot(name, source string) (SnapshotInfo, error) {
	if err := ValidateName(name); err != nil {
		return SnapshotInfo{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return SnapshotInfo{}, ErrClosed
	}
	if p.byName[name] != nil {
		return SnapshotInfo{}, fmt.Errorf("%w: %q is the name of a volume", ErrAlreadyExists, name)
	}
	src := p.byName[source]
	if s := p.snaps[name]; s != nil {
		if !s.sameSource(Source{Volume: source}, src) {
			return SnapshotInfo{}, fmt.Errorf("%w: snapshot %q exists of another source (%s)", ErrAlreadyExists, name, p.nameOf(s.srcUUID))
		}
		return p.snapshotInfo(s), nil
	}
	if src == nil {
		return SnapshotInfo{}, fmt.Errorf("%w: volume %q (the snapshot's source)", ErrNotFound, source)
	}
	if err := p.copyRefusal(src); err != nil {
		return SnapshotInfo{}, fmt.Errorf("pool: snapshot %q of %q: %w", name, source, err)
	}
	if src.arr == nil {
		return SnapshotInfo{}, fmt.Errorf("%w: volume %q is not assembled: %w", ErrFailedPrecondition, source, src.err)
	}
	v, err := p.createLocked(name, src.size, createSpec{snap: true, src: src, live: true, chunk: p.volumeChunk(src), nMembs: src.members})
	if err != nil {
		return SnapshotInfo{}, err
	}
	return p.snapshotInfo(v), nil
}

// Snapshot describes one snapshot.
func (p *Pool) Snapshot(name string) (SnapshotInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v := p.snaps[name]
	if v == nil {
		return SnapshotInfo{}, fmt.Errorf("%w: snapshot %q", ErrNotFound, name)
	}
	return p.snapshotInfo(v), nil
}

// Snapshots lists every snapshot, sorted by name.
func (p *Pool) Snapshots() []SnapshotInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return describeSorted(p.snaps, p.snapshotInfo)
}

// kind is "snapshot" or "volume", for messages.
func (v *volume) kind() string {
	if v.snap {
		return "snapshot"
	}
	return "volume"
}

// kindName is v's kind and name, for messages: snapshot "x", volume "y".
func (v *volume) kindName() string { return fmt.Sprintf("%s %q", v.kind(), v.name) }

// copying reports whether the copy into v has not finished.
func (v *volume) copying() bool {
	return v.flags&ExtentFlagCopying != 0 && v.flags&ExtentFlagCopyFailed == 0
}

// copied is the number of bytes the copy into v has done.
func (v *volume) copied() uint64 {
	switch {
	case v.flags&ExtentFlagCopy == 0:
		return 0
	case !v.copying() && v.flags&ExtentFlagCopyFailed == 0:
		if v.copySize != 0 {
			return v.copySize
		}
		return v.size
	case v.copy != nil:
		return uint64(v.copy.Copied())
	}
	return 0
}

// nameOf names the volume or snapshot u, or gives its UUID if it is gone.
func (p *Pool) nameOf(u UUID) string {
	if v := p.volumes[u]; v != nil {
		return v.name
	}
	return u.String()
}

// snapshotInfo describes a snapshot. Caller holds p.mu.
func (p *Pool) snapshotInfo(v *volume) SnapshotInfo {
	si := SnapshotInfo{Name: v.name, UUID: v.uuid, Source: v.srcName, SourceUUID: v.srcUUID, Size: v.size, CutAt: v.cutAt,
		Members: v.members, Copied: v.copied()}
	si.Ready = v.flags&(ExtentFlagCopying|ExtentFlagCopyFailed) == 0
	si.Health, _ = p.health(v)
	switch {
	case v.flags&ExtentFlagCopyFailed != 0:
		si.Health, si.Reason = Failed, "the copy from the source failed: the snapshot does not hold the volume's data"
	case v.arr == nil && v.err != nil:
		si.Reason = v.err.Error()
	case v.copying() && v.copy == nil:
		si.Health, si.Reason = Failed, "the copy from the source cannot run: the source is not assembled"
	}
	return si
}

// copySourceLocked resolves a volume's source. Caller holds p.mu.
func (p *Pool) copySourceLocked(s Source) (*volume, error) {
	var v *volume
	if s.Snapshot != "" {
		if v = p.snaps[s.Snapshot]; v == nil {
			return nil, fmt.Errorf("%w: snapshot %q (the source)", ErrNotFound, s.Snapshot)
		}
	} else if v = p.byName[s.Volume]; v == nil {
		return nil, fmt.Errorf("%w: volume %q (the source)", ErrNotFound, s.Volume)
	}
	if err := p.copyRefusal(v); err != nil {
		return nil, fmt.Errorf("pool: source %q: %w", v.name, err)
	}
	if v.arr == nil {
		return nil, fmt.Errorf("%w: source %q is not assembled: %w", ErrFailedPrecondition, v.name, v.err)
	}
	return v, nil
}

// sameSource reports whether s names v's source: by UUID while the source exists, else by
// the name and kind the copy record kept.
func (v *volume) sameSource(s Source, found *volume) bool {
	if (s.Volume != "") != v.srcLive {
		return false
	}
	if found != nil {
		return found.uuid == v.srcUUID
	}
	return s.Volume+s.Snapshot == v.srcName
}

// lookupSource finds a source by name, or nil.
func (p *Pool) lookupSource(s Source) *volume {
	if s.Snapshot != "" {
		return p.snaps[s.Snapshot]
	}
	return p.byName[s.Volume]
}

// copyFromLocked returns a volume or snapshot whose copy from v is still running.
func (p *Pool) copyFromLocked(v *volume) *volume {
	for _, t := range p.volumes {
		if t != v && t.copying() && t.srcUUID == v.uuid {
			return t
		}
	}
	return nil
}

// startCopyLocked writes v's copy record and makes the cut (live: the source's writes are
// held while the hook goes in). Caller holds p.mu.
func (p *Pool) startCopyLocked(v, src *volume, live bool) error {
	c, err := raid10.NewCopy(raid10.CopyConfig{Source: src.arr, Target: v.arr, Size: int64(src.size), Live: live,
		SourceName: src.name, OnFail: p.onCopyFail(v), OnReady: p.onCopyReady(v)})
	if err != nil {
		return err
	}
	v.copy, v.cutAt = c, c.Record().CutAt
	klog.InfoS("Copy cut", "target", v.name, "source", src.name, "live", live, "pause", c.Pause, "regionSize", c.Record().RegionSize)
	return nil
}

// setFlags updates v's flags in the labels of its present disks. Caller holds p.mu.
func (p *Pool) setFlags(v *volume, set, clear uint32) error {
	var first error
	for _, d := range p.holdersOf(v.uuid) {
		if err := p.writeLabel(d, flagExtents(v.uuid, set, clear)); err != nil && first == nil {
			first = err
		}
	}
	v.flags = v.flags&^clear | set
	for _, r := range v.roles {
		if r != nil {
			r.ext.Flags = r.ext.Flags&^clear | set
		}
	}
	return first
}

// onCopyReady records a finished copy in the labels (the record already says ready).
func (p *Pool) onCopyReady(v *volume) func() {
	return func() {
		go func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.closed || p.volumes[v.uuid] != v {
				return
			}
			if err := p.setFlags(v, 0, ExtentFlagCopying); err != nil {
				klog.ErrorS(err, "Recording a finished copy (the record says ready; Open records it again)", "name", v.name)
			}
			klog.InfoS("Copy ready", "target", v.name, "bytes", v.size)
		}()
	}
}

// onCopyFail records a failed copy in the labels before the source's writers go on.
func (p *Pool) onCopyFail(v *volume) func(error) {
	return func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed || p.volumes[v.uuid] != v {
			return
		}
		v.copyErr = err
		if lerr := p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying); lerr != nil {
			klog.ErrorS(lerr, "Recording a failed copy", "name", v.name)
		}
		klog.ErrorS(err, "Copy failed", "target", v.name, "source", p.nameOf(v.srcUUID))
	}
}

// resumeCopies runs at Open, after every array is assembled and before any is served: for
// each copy target it reads the record, and puts the hooks of a running copy back (the
// source's copy-before-write hook, the target's hydrate hook) before starting the copiers.
// Each target is then admitted: one whose copy failed or cannot run is not served.
// A target is settled after its source (a restore after the snapshot it reads, which may
// be filling itself), so resumeCopy sees whether the source holds its data.
func (p *Pool) resumeCopies() {
	var started []*raid10.Copy
	settled := map[*volume]bool{}
	var settle func(v *volume)
	settle = func(v *volume) {
		if settled[v] || v.flags&ExtentFlagCopy == 0 {
			return
		}
		settled[v] = true
		if s := p.sourceByPrefix(v); s != nil {
			settle(s)
		}
		if c := p.resumeCopy(v); c != nil {
			started = append(started, c)
		}
		p.admit(v)
	}
	for _, v := range p.volumes {
		settle(v)
	}
	// A source whose superblocks count more running copies than were resumed has a copy
	// target absent: its copy generation moves on (that record is void if it returns).
	for _, v := range p.volumes {
		if v.arr != nil {
			if err := v.arr.CopiesResumed(); err != nil {
				klog.ErrorS(err, "Recording the copy generation", "name", v.name)
			}
		}
	}
	for _, c := range started {
		c.Start()
	}
}

// resumeCopy settles the copy into target v at Open from its flags and its record: a
// finished copy is recorded so, an unfinished one resumes (the returned copier, not started
// yet) or, when it cannot, is marked failed, or stays stopped while its source is not
// assembled. Caller holds p.mu.
func (p *Pool) resumeCopy(v *volume) *raid10.Copy {
	if s := p.sourceByPrefix(v); s != nil {
		v.srcUUID = s.uuid
	}
	if v.arr == nil {
		if v.copying() {
			// Its hook cannot go back in: the source may change under it from now on.
			klog.ErrorS(v.err, "Copy target not assembled while its copy ran: marked failed", "name", v.name)
			v.copyErr = fmt.Errorf("it was not assembled when the pool opened while its copy ran: %w", v.err)
			_ = p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying)
		}
		return nil
	}
	rec, err := raid10.ReadCopyRecord(v.arr)
	switch {
	case errors.Is(err, raid10.ErrNoCopyRecord) && !v.copying():
		return nil // a grown copy target: the record went with the old tail
	case err != nil:
		klog.ErrorS(err, "Copy record unreadable", "name", v.name)
		if v.copying() {
			v.copyErr = fmt.Errorf("its copy record is unreadable: %w", err)
			_ = p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying)
		}
		return nil
	}
	v.srcUUID, v.cutAt, v.copySize, v.srcName, v.srcLive = rec.Source, rec.CutAt, uint64(rec.Size), rec.SourceName, rec.Live
	switch rec.State {
	case raid10.CopyReady:
		if v.copying() {
			_ = p.setFlags(v, 0, ExtentFlagCopying)
		}
		return nil
	case raid10.CopyFailed:
		if v.flags&ExtentFlagCopyFailed == 0 {
			_ = p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying)
		}
	}
	if !v.copying() {
		return nil
	}
	src := p.volumes[rec.Source]
	if src == nil || src.arr == nil {
		klog.ErrorS(nil, "Copy cannot resume: its source is not assembled", "name", v.name, "source", rec.SourceName, "sourceUUID", UUID(rec.Source))
		return nil
	}
	if err := p.copyRefusal(src); err != nil {
		// The source's own copy failed or is stopped: it has no hook to fill what it lacks,
		// so reading it would copy whatever its extents hold.
		if src.flags&ExtentFlagCopyFailed == 0 {
			klog.ErrorS(err, "Copy cannot resume: its source's own copy is stopped", "name", v.name, "source", src.name)
			return nil
		}
		klog.ErrorS(err, "Copy cannot resume: its source's own copy failed: marked failed", "name", v.name, "source", src.name)
		v.copyErr = fmt.Errorf("its source %s does not hold its data: its own copy failed", src.kindName())
		_ = p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying)
		return nil
	}
	c, err := raid10.ResumeCopy(raid10.CopyConfig{Source: src.arr, Target: v.arr, OnFail: p.onCopyFail(v), OnReady: p.onCopyReady(v)})
	if err != nil {
		klog.ErrorS(err, "Copy cannot resume: marked failed", "name", v.name)
		v.copyErr = fmt.Errorf("it could not resume: %w", err)
		_ = p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying)
		return nil
	}
	v.copy = c
	klog.InfoS("Copy resumed", "target", v.name, "source", src.name, "copied", c.Copied(), "of", rec.Size)
	return c
}

// sourceByPrefix is the volume or snapshot whose UUID starts with v's CopySource (its copy
// source as the labels keep it), or nil. Caller holds p.mu.
func (p *Pool) sourceByPrefix(v *volume) *volume {
	for _, s := range p.volumes {
		if s != v && [8]byte(s.uuid[:8]) == v.copySource {
			return s
		}
	}
	return nil
}

// stopCopies stops every copier (Close); the records keep their progress.
func (p *Pool) stopCopies() {
	for _, v := range p.volumes {
		if v.copy != nil {
			v.copy.Stop()
		}
	}
}

// sourceInfo is the Source of a volume filled from one. Caller holds p.mu.
func (p *Pool) sourceInfo(v *volume) *Source {
	if v.flags&ExtentFlagCopy == 0 {
		return nil
	}
	if v.srcName == "" {
		return nil
	}
	if v.srcLive {
		return &Source{Volume: v.srcName}
	}
	return &Source{Snapshot: v.srcName}
}
