package crstatus

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// Ready condition reasons of a Raid10Volume (besides v1alpha1.ReasonInsufficientCapacity).
const (
	ReasonProvisioned  = "Provisioned"  // True: the array runs (its health is in status.health)
	ReasonCreateFailed = "CreateFailed" // False: the pool refused the volume for another reason
	ReasonNotInPool    = "NotInPool"    // False: a provisioned volume is missing from the pool
	ReasonArrayFailed  = "ArrayFailed"  // False: the array lost both copies of some data, or did not assemble
)

// Ready and DisksHealthy condition reasons of a Raid10Node.
const (
	ConditionDisksHealthy = "DisksHealthy"
	ReasonPoolOpen        = "PoolOpen"
	ReasonAllDisksHealthy = "AllDisksHealthy"
	ReasonDiskNotHealthy  = "DiskNotHealthy"
)

// DiskIDs maps pool disk UUIDs to the IDs the Raid10Node lists: the disk's serial or WWN
// when it has one, else its pool UUID (files), else its path (a refused disk without a
// label). An identity that two disks share falls back to the UUID, as the list is keyed by ID.
func DiskIDs(disks []pool.DiskInfo) map[string]string {
	ids := make(map[string]string, len(disks))
	used := map[string]bool{}
	for _, d := range disks {
		id := d.Identity
		if id == "" || used[id] {
			id = d.UUID
		}
		if id == "" || used[id] {
			id = d.Path
		}
		used[id] = true
		ids[DiskKey(d)] = id
	}
	return ids
}

// DiskKey is what DiskIDs is keyed by: the UUID, or the path of a disk without one.
func DiskKey(d pool.DiskInfo) string {
	if d.UUID != "" {
		return d.UUID
	}
	return "path:" + d.Path
}

// memberState maps the engine's member state (pool.MemberInfo.State) to the API's.
func memberState(s string) v1alpha1.MemberState {
	switch s {
	case "in-sync":
		return v1alpha1.MemberStateInSync
	case "recovering":
		return v1alpha1.MemberStateRebuilding
	case "faulty":
		return v1alpha1.MemberStateFailed
	}
	return v1alpha1.MemberStateMissing
}

// syncKindRecovery is pool.Progress.Kind of a rebuild onto a recovering member.
const syncKindRecovery = "recovery"

// VolumeStatus is the status of vol for the pool's view info. prev is the status the
// object has; now stamps new conditions and a new rebuild.
func VolumeStatus(prev v1alpha1.Raid10VolumeStatus, vol *v1alpha1.Raid10Volume, info pool.VolumeInfo, ids map[string]string, now time.Time) v1alpha1.Raid10VolumeStatus {
	st := v1alpha1.Raid10VolumeStatus{
		ObservedGeneration: vol.Generation,
		Phase:              v1alpha1.VolumePhaseReady,
		Health:             v1alpha1.VolumeHealth(info.Health),
		Capacity:           resource.NewQuantity(int64(info.Size), resource.BinarySI),
		InSync:             fmt.Sprintf("%d/%d", info.InSync, len(info.Members)),
		DevicePath:         prev.DevicePath, // the agent sets it from Options.Devices
		Frontend:           prev.Frontend,
		Conditions:         slices.Clone(prev.Conditions),
		BadBlocks:          info.BadBlocks,
		LostBlocks:         info.LostBlocks,
		Scrub:              ScrubStatus(prev.Scrub, info.Scrub),
		Hydration:          hydrationStatus(vol, info),
		Encrypted:          encrypted(vol),
	}
	rebuilding := int32(-1)
	var notes []string
	for _, m := range info.Members {
		ms := v1alpha1.MemberStatus{Index: int32(m.Role), Disk: ids[m.DiskUUID], State: memberState(m.State),
			BadBlocks: m.BadBlocks, Timeouts: int64(m.TimedOut), SlowStalls: int64(m.SlowLastCopy)}
		switch ms.State {
		case v1alpha1.MemberStateRebuilding:
			if rebuilding < 0 {
				rebuilding = ms.Index
			}
			ms.Message = "being rebuilt from its mirror"
		case v1alpha1.MemberStateFailed:
			ms.Message = fmt.Sprintf("disk %s failed", OrDash(m.DiskPath))
			notes = append(notes, fmt.Sprintf("member %d failed", m.Role))
		case v1alpha1.MemberStateMissing:
			ms.Message = "no disk in this slot (missing, failed or removed)"
			notes = append(notes, fmt.Sprintf("member %d missing", m.Role))
		case v1alpha1.MemberStateInSync:
			if m.BadBlocks > 0 {
				ms.Message = fmt.Sprintf("%d blocks recorded bad: read from the mirror", m.BadBlocks)
			}
		}
		st.Members = append(st.Members, ms)
	}
	if p := info.Sync; p != nil && p.Kind == syncKindRecovery {
		rp := &v1alpha1.RebuildProgress{
			Member:         max(rebuilding, 0),
			Percent:        int32(math.Min(100, math.Max(0, math.Floor(p.Percent)))),
			DoneBytes:      p.Done,
			TotalBytes:     p.Total,
			BytesPerSecond: int64(p.Rate),
		}
		if p.ETA > 0 {
			eta := int64(math.Ceil(p.ETA.Seconds()))
			rp.ETASeconds = &eta
		}
		if old := prev.Rebuild; old != nil && old.Member == rp.Member && old.StartTime != nil {
			rp.StartTime = old.StartTime
		} else {
			t := metav1.NewTime(now.Truncate(time.Second))
			rp.StartTime = &t
		}
		st.Rebuild = rp
	} else if p != nil {
		notes = append(notes, fmt.Sprintf("%s %.0f%%", p.Kind, p.Percent))
	}
	if b := blocksNote(info.BadBlocks, info.LostBlocks); b != "" {
		notes = append(notes, b)
	}
	if info.Reason != "" {
		notes = append(notes, info.Reason)
	}
	st.Message = strings.Join(notes, "; ")

	cond := metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonProvisioned,
		Message: fmt.Sprintf("%s, %s members in sync", info.Health, st.InSync), ObservedGeneration: vol.Generation,
	}
	if b := blocksNote(info.BadBlocks, info.LostBlocks); b != "" && info.Health != pool.Failed {
		cond.Message += ", " + b
	}
	if info.Health == pool.Failed {
		st.Phase = v1alpha1.VolumePhaseFailed
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonArrayFailed
		if st.Message != "" {
			cond.Message += ": " + st.Message
		}
	}
	setCondition(&st.Conditions, cond, now)
	setCondition(&st.Conditions, redundantCondition(info, st, vol.Generation), now)
	return st
}

// encrypted reports whether vol's StorageClass asked for encryption at rest (the
// annotation the controller writes at creation): status.encrypted.
func encrypted(vol *v1alpha1.Raid10Volume) bool {
	return vol.Annotations[v1alpha1.EncryptedAnnotation] == "true"
}

// Redundant condition reasons of a Raid10Volume: the health, or BadBlocks for a volume
// whose members are all in sync but with blocks recorded bad.
const (
	ReasonRedundantHealthy = "Healthy"
	ReasonRedundantBad     = "BadBlocks"
)

// redundantCondition says whether every chunk has both its copies: True only while Healthy.
// A Rebuilding volume has one copy of the chunks of the member being rebuilt until the
// rebuild ends: its message carries the progress.
func redundantCondition(info pool.VolumeInfo, st v1alpha1.Raid10VolumeStatus, gen int64) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionRedundant, Status: metav1.ConditionFalse,
		Reason: string(info.Health), ObservedGeneration: gen}
	switch info.Health {
	case pool.Healthy:
		c.Status, c.Reason = metav1.ConditionTrue, ReasonRedundantHealthy
		c.Message = "every chunk has both its copies, " + st.InSync + " members in sync"
	case pool.Rebuilding:
		c.Message = "redundancy reduced until the rebuild ends: " + st.InSync + " members in sync"
		if r := st.Rebuild; r != nil {
			c.Message += fmt.Sprintf(", member %d %d%% rebuilt", r.Member, r.Percent)
			if r.ETASeconds != nil {
				c.Message += fmt.Sprintf(", ETA %s", time.Duration(*r.ETASeconds)*time.Second)
			}
		}
	case pool.Degraded:
		if info.InSync == len(info.Members) {
			c.Reason = ReasonRedundantBad
		}
		c.Message = "redundancy reduced: " + st.InSync + " members in sync"
		if b := blocksNote(info.BadBlocks, info.LostBlocks); b != "" {
			c.Message += ", " + b
		}
	default:
		c.Message = "data lost: some chunk has no copy left"
		if info.Reason != "" {
			c.Message += ": " + info.Reason
		}
	}
	return c
}

// blocksNote says how many blocks are recorded bad and lost; empty when none are.
func blocksNote(bad, lost int64) string {
	switch {
	case lost > 0:
		return fmt.Sprintf("%d bad blocks, %d of them lost (bad on every copy: reads there fail until rewritten)", bad, lost)
	case bad > 0:
		return fmt.Sprintf("%d bad blocks (each still read from its other copy)", bad)
	}
	return ""
}

// FailedStatus is the status of a volume the pool cannot provide: phase Failed, Ready
// False with reason and message.
func FailedStatus(prev v1alpha1.Raid10VolumeStatus, vol *v1alpha1.Raid10Volume, reason, msg string, now time.Time) v1alpha1.Raid10VolumeStatus {
	st := *prev.DeepCopy()
	st.ObservedGeneration = vol.Generation
	st.Phase = v1alpha1.VolumePhaseFailed
	st.Message = msg
	st.Rebuild = nil
	st.Encrypted = encrypted(vol)
	if reason == ReasonNotInPool {
		st.Health = v1alpha1.VolumeHealthFailed
	}
	setCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg,
		ObservedGeneration: vol.Generation,
	}, now)
	return st
}

// CreateFailedReason is the Ready condition reason for an error of pool.CreateVolume or
// pool.CreateSnapshot, and whether the pool refused the object for this spec (final: no
// space, invalid, no such source, a volume or snapshot of that name with other parameters)
// rather than failed for now (I/O, a closed pool: retry).
func CreateFailedReason(err error) (reason string, final bool) {
	switch {
	case errors.Is(err, pool.ErrNoSpace):
		return v1alpha1.ReasonInsufficientCapacity, true
	case errors.Is(err, pool.ErrNotFound):
		return v1alpha1.ReasonSourceNotFound, true // a snapshot's, restore's or clone's source
	case errors.Is(err, pool.ErrInvalidArgument), errors.Is(err, pool.ErrAlreadyExists), errors.Is(err, pool.ErrFailedPrecondition):
		return ReasonCreateFailed, true
	}
	return ReasonCreateFailed, false
}

// ExpandPending returns st with phase Expanding and msg (why the pool has not grown the
// array to the spec yet) leading its message.
func ExpandPending(st v1alpha1.Raid10VolumeStatus, msg string) v1alpha1.Raid10VolumeStatus {
	st.Phase = v1alpha1.VolumePhaseExpanding
	if st.Message != "" {
		st.Message = msg + "; " + st.Message
	} else {
		st.Message = msg
	}
	return st
}

// NodeStatus is the status of the Raid10Node for a pool snapshot.
func NodeStatus(prev v1alpha1.Raid10NodeStatus, ps pool.Status, memberFree map[string]uint64, now time.Time) v1alpha1.Raid10NodeStatus {
	st := v1alpha1.Raid10NodeStatus{Conditions: slices.Clone(prev.Conditions)}
	ids := DiskIDs(ps.Disks)
	var bad []string
	for _, d := range ps.Disks {
		ds := v1alpha1.DiskStatus{ID: ids[DiskKey(d)], Path: d.Path, SizeBytes: int64(d.Size)}
		switch d.Status {
		case pool.StatusRemoved:
			continue // replaced: no longer part of the pool
		case pool.StatusActive:
			ds.State = v1alpha1.DiskStateHealthy
			ds.FreeBytes = int64(memberFree[d.UUID])
		case pool.StatusSpare:
			ds.State = v1alpha1.DiskStateHealthy
			ds.Message = "hot spare: takes over a failed disk, holds no new volumes"
		case pool.StatusMissing:
			ds.State = v1alpha1.DiskStateMissing
			ds.Message = "not found at start or since"
		case pool.StatusRefused:
			ds.State = v1alpha1.DiskStateFailed
			ds.Message = "refused: " + d.Reason
		default:
			ds.State = v1alpha1.DiskStateFailed
			ds.Message = "failed"
			if d.Reason != "" {
				ds.Message += ": " + d.Reason
			}
		}
		if ds.Message == "" && d.Reason != "" {
			ds.Message = d.Reason
		}
		st.Disks = append(st.Disks, ds)
		st.DiskCount++
		if ds.State == v1alpha1.DiskStateHealthy {
			st.HealthyDisks++
		} else {
			bad = append(bad, fmt.Sprintf("%s %s", d.Path, ds.State))
		}
	}
	c := ps.Capacity
	st.Capacity = v1alpha1.NodeCapacity{
		Raw:    *resource.NewQuantity(int64(c.Raw), resource.BinarySI),
		Usable: *resource.NewQuantity(int64(c.Usable), resource.BinarySI),
		Free:   *resource.NewQuantity(int64(c.LargestVolume), resource.BinarySI),
	}
	setCondition(&st.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonPoolOpen,
		Message: fmt.Sprintf("pool %s (%s) open: %d of %d disks healthy, %d volumes", ps.Name, ps.UUID, st.HealthyDisks, st.DiskCount, len(ps.Volumes)),
	}, now)
	dh := metav1.Condition{Type: ConditionDisksHealthy, Status: metav1.ConditionTrue, Reason: ReasonAllDisksHealthy, Message: "every disk is healthy"}
	if len(bad) > 0 {
		dh.Status, dh.Reason, dh.Message = metav1.ConditionFalse, ReasonDiskNotHealthy, strings.Join(bad, ", ")
	}
	setCondition(&st.Conditions, dh, now)
	return st
}

// setCondition is meta.SetStatusCondition with a given time for a transition.
func setCondition(conds *[]metav1.Condition, c metav1.Condition, now time.Time) {
	c.LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
	meta.SetStatusCondition(conds, c)
}

// OrDash is s, or "-" when s is empty: how a message names a disk without a path or ID.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
