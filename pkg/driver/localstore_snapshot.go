package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// The standalone store's snapshots, as its volumes: the Raid10Snapshot objects live in this
// process, the pool does the work synchronously (pool.CreateSnapshot returns once the cut is
// durable), and the status is the pool's, translated as the node agent translates it
// (crstatus.SnapshotStatus). The records file keeps what the pool cannot (the CSI name and
// VolumeSnapshot annotations, the uid, creation time):
//
//	"snapshots": [{"name": "snapshot-…", "uid": "…", "created": "…",
//	  "annotations": {"raid10.csi.io/csi-name": "…"}, "finalizers": ["raid10.csi.io/extents"],
//	  "spec": {"source": "pvc-…", "node": "…"}, "cut": true, "deleting": false}]
//
// Recovery at NewLocalStore: a record marked deleting has its pool snapshot deleted (when
// the pool still refuses, it stays deleting) and is dropped; a record not cut is marked cut
// when the pool has the snapshot and dropped when it does not; a cut record whose pool
// snapshot is gone reports phase Failed, reason NotInPool, and is never cut again.

// localSnapshot is one Raid10Snapshot of the store and its record's flags.
type localSnapshot struct {
	obj      *v1alpha1.Raid10Snapshot
	cut      bool // the pool made the cut: the snapshot holds data
	deleting bool
}

// localSnapshotRecord is one snapshot in the records file.
type localSnapshotRecord struct {
	Name        string                      `json:"name"`
	UID         types.UID                   `json:"uid"`
	Created     metav1.Time                 `json:"created"`
	Annotations map[string]string           `json:"annotations,omitempty"`
	Finalizers  []string                    `json:"finalizers,omitempty"`
	Spec        v1alpha1.Raid10SnapshotSpec `json:"spec"`
	Cut         bool                        `json:"cut"`
	Deleting    bool                        `json:"deleting,omitempty"`
}

func (r localSnapshotRecord) object(rv string) *v1alpha1.Raid10Snapshot {
	v := &v1alpha1.Raid10Snapshot{Spec: r.Spec}
	v.Name, v.UID, v.Generation, v.CreationTimestamp = r.Name, r.UID, 1, r.Created
	v.Annotations, v.Finalizers, v.ResourceVersion = r.Annotations, r.Finalizers, rv
	return v
}

// recoverSnapshots loads the snapshot records and finishes what a crash interrupted; it
// reports whether a record changed. Called by NewLocalStore before s is shared.
func (s *LocalStore) recoverSnapshots(recs []localSnapshotRecord) (bool, error) {
	changed := false
	for _, r := range recs {
		_, perr := s.pool.Snapshot(r.Name)
		inPool := perr == nil
		if perr != nil && !errors.Is(perr, pool.ErrNotFound) {
			return false, fmt.Errorf("local store: snapshot %q: %w", r.Name, perr)
		}
		ls := &localSnapshot{obj: r.object(s.nextVersion()), cut: r.Cut, deleting: r.Deleting}
		switch {
		case r.Deleting:
			if err := s.pool.DeleteSnapshot(r.Name); err != nil {
				if !errors.Is(err, pool.ErrFailedPrecondition) {
					return false, fmt.Errorf("local store: finish deleting snapshot %q: %w", r.Name, err)
				}
				t := metav1.NewTime(time.Now().Truncate(time.Second))
				ls.obj.DeletionTimestamp = &t
				s.snaps[r.Name] = ls // the pool still refuses: retried on reads
				continue
			}
			klog.InfoS("Finished an interrupted snapshot delete", "snapshotID", r.Name)
			changed = true
			continue
		case !r.Cut && !inPool:
			klog.InfoS("Dropped the record of a snapshot whose cut never finished", "snapshotID", r.Name)
			changed = true
			continue
		case !r.Cut:
			ls.cut, changed = true, true
		}
		s.snaps[r.Name] = ls
	}
	return changed, nil
}

// snapshotRecordsLocked is every snapshot record, sorted by name.
func (s *LocalStore) snapshotRecordsLocked() []localSnapshotRecord {
	var out []localSnapshotRecord
	for _, ls := range s.snaps {
		o := ls.obj
		out = append(out, localSnapshotRecord{Name: o.Name, UID: o.UID, Created: o.CreationTimestamp,
			Annotations: o.Annotations, Finalizers: o.Finalizers, Spec: o.Spec, Cut: ls.cut, Deleting: ls.deleting})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// refreshSnapshotLocked updates ls's status from the pool and returns a copy of the object.
// A snapshot being deleted has its delete retried first.
func (s *LocalStore) refreshSnapshotLocked(ls *localSnapshot, now time.Time) *v1alpha1.Raid10Snapshot {
	snap := ls.obj
	if ls.deleting {
		if err := s.finishSnapshotDeleteLocked(ls); err != nil {
			snap.Status = crstatus.SnapshotDeleteWaiting(snap.Status, fmt.Sprintf("delete waits: %v", err))
		}
		return snap.DeepCopy()
	}
	if !ls.cut {
		return snap.DeepCopy() // refused by the pool: the Failed status of the create stays
	}
	info, err := s.pool.Snapshot(snap.Name)
	switch {
	case errors.Is(err, pool.ErrNotFound):
		msg := "the snapshot was cut but is not in the node's pool (its disks are missing or were replaced)"
		snap.Status = crstatus.SnapshotFailedStatus(snap.Status, snap, crstatus.ReasonNotInPool, msg, now)
	case err != nil:
		snap.Status = crstatus.SnapshotFailedStatus(snap.Status, snap, crstatus.ReasonArrayFailed, err.Error(), now)
	default:
		snap.Status = crstatus.SnapshotStatus(snap.Status, snap, info, now)
	}
	return snap.DeepCopy()
}

// GetSnapshot implements VolumeStore.
func (s *LocalStore) GetSnapshot(_ context.Context, name string) (*v1alpha1.Raid10Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.snaps[name]
	if ls == nil {
		return nil, fmt.Errorf("raid10snapshot %q: %w", name, ErrNotFound)
	}
	out := s.refreshSnapshotLocked(ls, time.Now())
	if s.snaps[name] == nil {
		return nil, fmt.Errorf("raid10snapshot %q: %w", name, ErrNotFound) // the delete finished
	}
	return out, nil
}

// ListSnapshots implements VolumeStore.
func (s *LocalStore) ListSnapshots(context.Context) ([]v1alpha1.Raid10Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	out := make([]v1alpha1.Raid10Snapshot, 0, len(s.snaps))
	for name, ls := range s.snaps {
		o := s.refreshSnapshotLocked(ls, now)
		if s.snaps[name] != nil {
			out = append(out, *o)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// CreateSnapshot implements VolumeStore: it records snap, then cuts it in the pool at once.
func (s *LocalStore) CreateSnapshot(_ context.Context, snap *v1alpha1.Raid10Snapshot) error {
	if err := s.checkNew("raid10snapshot", snap.Name, snap.Spec.Node); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snaps[snap.Name] != nil {
		return fmt.Errorf("raid10snapshot %q: %w", snap.Name, ErrAlreadyExists)
	}
	now := time.Now()
	stampNew(&snap.ObjectMeta, now)
	snap.Status = v1alpha1.Raid10SnapshotStatus{}
	ls := &localSnapshot{obj: snap.DeepCopy()}
	s.snaps[snap.Name] = ls
	if err := s.saveLocked(); err != nil {
		delete(s.snaps, snap.Name)
		return err
	}
	info, err := s.pool.CreateSnapshot(snap.Name, snap.Spec.Source)
	if err != nil {
		reason, final := crstatus.CreateFailedReason(err)
		if !final {
			delete(s.snaps, snap.Name)
			if serr := s.saveLocked(); serr != nil {
				klog.ErrorS(serr, "Dropping the record of a snapshot the pool did not cut", "snapshotID", snap.Name)
			}
			return fmt.Errorf("raid10snapshot %q: cut in the pool: %w", snap.Name, err)
		}
		klog.ErrorS(err, "Snapshot cannot be cut", "snapshotID", snap.Name, "source", snap.Spec.Source, "reason", reason)
		ls.obj.Status = crstatus.SnapshotFailedStatus(ls.obj.Status, ls.obj, reason, err.Error(), now)
	} else {
		ls.cut = true
		if err := s.saveLocked(); err != nil {
			return err // the pool has it; NewLocalStore marks such a record cut
		}
		klog.InfoS("Snapshot cut", "snapshotID", snap.Name, "source", snap.Spec.Source, "cutAt", info.CutAt, "size", info.Size)
	}
	ls.obj.ResourceVersion = s.nextVersion()
	snap.ResourceVersion = ls.obj.ResourceVersion
	return nil
}

// DeleteSnapshot implements VolumeStore: the pool snapshot is deleted before the call
// returns, unless the pool refuses for now (a restore copies from it): then the record stays,
// marked deleting, its status says why, and reads try again. A missing one is success.
func (s *LocalStore) DeleteSnapshot(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.snaps[name]
	if ls == nil {
		return nil
	}
	if !ls.deleting {
		ls.deleting = true
		t := metav1.NewTime(time.Now().Truncate(time.Second))
		ls.obj.DeletionTimestamp = &t
		ls.obj.ResourceVersion = s.nextVersion()
		if err := s.saveLocked(); err != nil {
			ls.deleting, ls.obj.DeletionTimestamp = false, nil
			return err
		}
	}
	if err := s.finishSnapshotDeleteLocked(ls); err != nil {
		ls.obj.Status = crstatus.SnapshotDeleteWaiting(ls.obj.Status, fmt.Sprintf("delete waits: %v", err))
		if errors.Is(err, pool.ErrFailedPrecondition) {
			return nil // deletion asked; the status says why it waits
		}
		return err
	}
	return nil
}

// finishSnapshotDeleteLocked deletes ls's pool snapshot and drops its record.
func (s *LocalStore) finishSnapshotDeleteLocked(ls *localSnapshot) error {
	name := ls.obj.Name
	if err := s.pool.DeleteSnapshot(name); err != nil {
		return fmt.Errorf("raid10snapshot %q: delete from the pool: %w", name, err)
	}
	delete(s.snaps, name)
	if err := s.saveLocked(); err != nil {
		return err // the pool snapshot is gone; a restart finishes from the deleting record
	}
	klog.InfoS("Snapshot deleted", "snapshotID", name)
	return nil
}
