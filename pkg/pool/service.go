package pool

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// Which arrays may be handed out for I/O. A volume's array is served (Array), read as a copy
// source (CreateSnapshot, a clone or a restore) or kept assembled only while it holds what
// it claims to hold. A copy target that does not hold its source's data (its copy failed,
// or it is unfinished and nothing can finish it) is never handed out, by whatever path it
// was assembled:
//
//   - admit is the last step of every assembly: at Open (resumeCopies, once each copy is
//     resumed or marked failed) and late, when a disk returns (AddDisk) or a failed disk is
//     re-added (ReaddDisk), both through readdRoles. A volume it refuses gives its array
//     back; its health is Failed with the reason. ReplaceDisk and the hot spares never
//     assemble: they skip a volume without an array. A volume assembled late may be the
//     source of copies that stopped at Open because it was not assembled: they resume
//     (or are voided) before its array is handed out (resumeCopiesFrom).
//   - servable is the check at every hand-out: Array, and the source checks of
//     CreateSnapshot and copySourceLocked. It also catches a copy that fails while its
//     volume is assembled (the engine then fails the volume's I/O into uncopied regions;
//     no new user gets the array).

// copyRefusal says why v does not hold its source's data: its copy failed, or it is
// unfinished and cannot run (its source was not assembled when the pool opened, so no
// copier fills it and no hook hydrates it); nil when it holds it, or is being filled.
// The error wraps ErrFailedPrecondition and names v and its source. Caller holds p.mu.
func (p *Pool) copyRefusal(v *volume) error {
	switch {
	case v.flags&ExtentFlagCopyFailed != 0:
		why := ""
		if v.copyErr != nil {
			why = fmt.Sprintf(" (%v)", v.copyErr)
		}
		return fmt.Errorf("%w: %s does not hold its source's data: its copy from %s failed%s; delete it, and create it again from its source",
			ErrFailedPrecondition, v.kindName(), p.sourceDesc(v), why)
	case v.copying() && v.copy == nil:
		return fmt.Errorf("%w: %s does not hold its source's data yet: its copy from %s is unfinished and stopped, because the source was not assembled (or its own copy was stopped) when the pool opened; it is served again once the pool opens with the source assembled and the copy resumes",
			ErrFailedPrecondition, v.kindName(), p.sourceDesc(v))
	}
	return nil
}

// servable is nil when v's array may be handed out for I/O: v holds its source's data (or
// is being filled from it) and is assembled. Otherwise the error names v and says why
// (copyRefusal's, or errNotAssembled with the assembly's error). Caller holds p.mu.
func (p *Pool) servable(v *volume) error {
	if err := p.copyRefusal(v); err != nil {
		return err
	}
	if v.arr == nil {
		return fmt.Errorf("%w: %q: %w", errNotAssembled, v.name, v.err)
	}
	return nil
}

// admit is the last step of every assembly (see above): a failed copy is recorded on every
// present disk of v (a disk that was away when the copy failed missed it), and a volume
// that copyRefusal refuses gives its array back (if it has one), with the refusal as v.err
// (its health is Failed with that reason). A snapshot
// keeps its array: it is never served, snapshotInfo reports it Failed and servable refuses
// it as a restore's source. Caller holds p.mu.
func (p *Pool) admit(v *volume) {
	if v.flags&ExtentFlagCopyFailed != 0 && !p.labelsSay(v, ExtentFlagCopyFailed) {
		if err := p.setFlags(v, ExtentFlagCopyFailed, ExtentFlagCopying); err != nil {
			klog.ErrorS(err, "Recording a failed copy", "name", v.name)
		}
	}
	err := p.copyRefusal(v)
	if v.snap || err == nil {
		return
	}
	if v.arr != nil {
		_ = v.arr.Close()
		klog.ErrorS(err, "Volume not served", "volume", v.name, "volumeUUID", v.uuid)
	}
	v.arr, v.err = nil, err
}

// assembleLate assembles v after Open, when a disk of it returned or was re-added, and
// admits it. A volume that admit would refuse is not assembled at all. Once assembled, v
// may be the source of copies stopped at Open because it was not assembled then: they
// resume (resumeCopiesFrom) before its array can be handed out. Caller holds p.mu.
func (p *Pool) assembleLate(v *volume) {
	if v.snap || p.copyRefusal(v) == nil {
		p.assemble(v)
	}
	p.admit(v)
	if v.arr != nil {
		p.resumeCopiesFrom(v)
	}
}

// resumeCopiesFrom resumes, at src's late assembly and before src's array is handed to
// anyone, every copy from src that stopped at Open because src was not assembled: the
// source's copy-before-write hook and the target's hydrate hook go in as at Open (a
// target whose array admit gave back is assembled again first; one that cannot be is
// marked failed). Then src.arr.CopiesResumed moves src's copy generation on if its
// superblocks count a running copy that did not resume (its target is absent, or failed
// to resume), so that copy's record is refused (raid10.ErrCopyStale) if it comes back:
// src is served without its hook from now on. Resuming rather than voiding keeps the
// snapshots and clones that can still be filled: src took no write since the pool
// opened (it was not assembled), so their records still say what it holds.
// Caller holds p.mu.
func (p *Pool) resumeCopiesFrom(src *volume) {
	var started []*raid10.Copy
	for _, t := range p.volumes {
		if t == src || !t.copying() || t.copy != nil || t.srcUUID != src.uuid {
			continue
		}
		if t.arr == nil {
			p.assemble(t)
		}
		if t.arr == nil {
			klog.ErrorS(t.err, "Copy target not assembled when its source was: marked failed", "name", t.name, "source", src.name)
			t.copyErr = fmt.Errorf("it could not be assembled when its source %q was: %w", src.name, t.err)
			_ = p.setFlags(t, ExtentFlagCopyFailed, ExtentFlagCopying)
		} else if c := p.resumeCopy(t); c != nil {
			started = append(started, c)
		}
		p.admit(t)
		if t.copy != nil && t.arr != nil {
			p.resumeCopiesFrom(t) // restores stopped because t, their source, was stopped
		}
	}
	if err := src.arr.CopiesResumed(); err != nil {
		klog.ErrorS(err, "Recording the copy generation", "name", src.name)
	}
	for _, c := range started {
		c.Start()
	}
}

// labelsSay reports whether every present disk's entry of v carries flag. Caller holds p.mu.
func (p *Pool) labelsSay(v *volume, flag uint32) bool {
	for _, d := range p.holdersOf(v.uuid) {
		for _, x := range d.label.Extents {
			if x.Volume == v.uuid && x.Flags&flag == 0 {
				return false
			}
		}
	}
	return true
}

// sourceDesc names v's copy source for messages: snapshot "s" or volume "v" as the copy
// record kept it, else the source's current name, else "its source" (v was never
// assembled, so its record was never read, and the source is gone). Caller holds p.mu.
func (p *Pool) sourceDesc(v *volume) string {
	switch {
	case v.srcName != "" && v.srcLive:
		return fmt.Sprintf("volume %q", v.srcName)
	case v.srcName != "":
		return fmt.Sprintf("snapshot %q", v.srcName)
	case !v.srcUUID.IsZero() && p.volumes[v.srcUUID] != nil:
		return p.volumes[v.srcUUID].kindName()
	}
	return "its source"
}
