package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/internal/atomicfile"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// LocalRecordsFile is the name of the standalone store's records file in --state-dir.
const LocalRecordsFile = "volumes.json"

// localRecordsVersion is the version of the records file this code writes and reads; a file
// of another version is refused, never rewritten.
const localRecordsVersion = 1

// localExpandRetry is how often a read of a volume whose pool array is smaller than its spec
// tries the expansion again (the pool refuses it while the volume is not Healthy, or when
// no free space follows an extent), as the node agent does every 15 s.
const localExpandRetry = 2 * time.Second

// LocalStore is the VolumeStore of the standalone mode (--mode=all, no cluster): the
// controller's Raid10Volumes live in this process, backed by the node's own pool, and their
// status is the pool's, translated exactly as the node agent translates it
// (crstatus.VolumeStatus, crstatus.NodeStatus). The controller's create, expand and delete logic therefore runs
// unchanged; its waits find the work already done, because the store does it synchronously:
//
//   - CreateVolume records the object, creates the pool volume (spec.sizeBytes,
//     spec.layout.members and chunkSizeBytes, as the agent does), and marks the record
//     provisioned. A pool refusal leaves the object with phase Failed and the agent's
//     reasons (InsufficientCapacity for pool.ErrNoSpace, else CreateFailed), which the
//     controller answers and cleans up as it does for the agent.
//   - UpdateVolume records the new spec (a new generation) and grows the pool volume; a
//     refused expansion is phase Expanding, retried on reads every localExpandRetry.
//   - spec.limits are put on the pool volume (pool.SetVolumeLimits) when they change, and
//     at NewLocalStore, since the pool keeps them in memory only (localstore_limits.go);
//     spec.rates likewise (pool.SetVolumeRates, localstore_rates.go), and
//     spec.scrubSchedule (pool.SetVolumeScrubSchedule, localstore_scrub.go).
//   - DeleteVolume marks the record deleting, deletes the pool volume, drops the record.
//   - GetNode and ListNodes report one Raid10Node, named after the node ID, from
//     pool.Status and pool.MemberFree.
//
// What the pool cannot hold (the CSI name and PVC annotations, volume mode, fsType,
// generation) is kept in the records file (LocalRecordsFile in the state directory),
// JSON, replaced atomically (atomicfile.Write) before and after each pool change:
//
//	{"version": 1, "volumes": [{"name": "pvc-…", "uid": "…", "generation": 1,
//	  "created": "2026-11-30T07:00:00Z", "annotations": {"raid10.csi.io/csi-name": "…"},
//	  "finalizers": ["raid10.csi.io/extents"], "spec": {Raid10VolumeSpec},
//	  "provisioned": true, "deleting": false}]}
//
// Recovery at NewLocalStore: a record marked deleting has its pool volume deleted and is
// dropped (the delete resumes); a record not yet provisioned is marked provisioned when the
// pool has the volume (the create finished, only the flag was not written) and dropped when
// it does not (the create never returned; the provisioner's retry creates it afresh); a
// provisioned record whose pool volume is gone reports phase Failed, reason NotInPool, and is
// never created again blank. Pool volumes without a record (made with kubectl-raid10 --local)
// are left alone and not listed.
//
// Resource versions are per process: the controller in the same process is the only writer.
type LocalStore struct {
	pool    *pool.Pool
	nodeID  string
	path    string
	devices AttachedDevices // nil: no delete guard (UseDevices)

	// mu serialises every call: the pool serialises its own changes anyway, and a read
	// may retry an expansion.
	mu       sync.Mutex
	vols     map[string]*localVolume
	snaps    map[string]*localSnapshot
	node     v1alpha1.Raid10NodeStatus // last reported, for condition transition times
	version  int64                     // last resourceVersion given
	expanded map[string]time.Time      // last expansion attempt per volume
	limits   map[string]raid10.Limits  // per volume: the QoS limits last put on the pool
	rates    map[string]raid10.Rates   // per volume: the rates last put on the pool
	// scrubSchedules per volume: the scrub schedule last put on the pool (zero: the node's)
	scrubSchedules map[string]pool.ScrubConfig
}

// localVolume is one Raid10Volume of the store: the object (metadata, spec and the status
// last reported) and its record's flags.
type localVolume struct {
	obj         *v1alpha1.Raid10Volume
	provisioned bool
	deleting    bool
}

// localRecords is the records file.
type localRecords struct {
	Version   int                   `json:"version"`
	Volumes   []localRecord         `json:"volumes"`
	Snapshots []localSnapshotRecord `json:"snapshots,omitempty"`
}

// localRecord is one volume in the records file.
type localRecord struct {
	Name        string                    `json:"name"`
	UID         types.UID                 `json:"uid"`
	Generation  int64                     `json:"generation"`
	Created     metav1.Time               `json:"created"`
	Annotations map[string]string         `json:"annotations,omitempty"`
	Finalizers  []string                  `json:"finalizers,omitempty"`
	Spec        v1alpha1.Raid10VolumeSpec `json:"spec"`
	Provisioned bool                      `json:"provisioned"`
	Deleting    bool                      `json:"deleting,omitempty"`
}

var _ VolumeStore = (*LocalStore)(nil)

// NewLocalStore opens the standalone store of node nodeID over p, with its records in the
// file recordsPath (its directory must exist; a missing file is an empty store), and
// finishes what a crash interrupted (see LocalStore). A records file that cannot be read or
// parsed, or of another version, is an error naming it.
func NewLocalStore(p *pool.Pool, nodeID, recordsPath string) (*LocalStore, error) {
	if p == nil || nodeID == "" || recordsPath == "" {
		return nil, fmt.Errorf("local store needs a pool, a node ID and a records path: %w", ErrInvalidArgument)
	}
	s := &LocalStore{pool: p, nodeID: nodeID, path: recordsPath, vols: map[string]*localVolume{}, snaps: map[string]*localSnapshot{},
		expanded: map[string]time.Time{}, limits: map[string]raid10.Limits{}, rates: map[string]raid10.Rates{},
		scrubSchedules: map[string]pool.ScrubConfig{}}
	b, err := os.ReadFile(recordsPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("local store: read %s: %w", recordsPath, err)
	}
	var f localRecords
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("local store: %s is not a records file: %w", recordsPath, err)
	}
	if f.Version != localRecordsVersion {
		return nil, fmt.Errorf("local store: %s has version %d, this plugin reads version %d", recordsPath, f.Version, localRecordsVersion)
	}
	changed := false
	for _, r := range f.Volumes {
		_, perr := p.Volume(r.Name)
		inPool := perr == nil
		if perr != nil && !errors.Is(perr, pool.ErrNotFound) {
			return nil, fmt.Errorf("local store: volume %q: %w", r.Name, perr)
		}
		switch {
		case r.Deleting:
			if err := p.DeleteVolume(r.Name); err != nil {
				return nil, fmt.Errorf("local store: finish deleting volume %q: %w", r.Name, err)
			}
			klog.InfoS("Finished an interrupted volume delete", "volumeID", r.Name)
			changed = true
			continue
		case !r.Provisioned && !inPool:
			klog.InfoS("Dropped the record of a volume whose create never finished", "volumeID", r.Name)
			changed = true
			continue
		case !r.Provisioned:
			r.Provisioned, changed = true, true
		}
		lv := &localVolume{obj: r.object(s.nextVersion()), provisioned: r.Provisioned}
		if inPool { // the pool forgot them: put them on again now, not at the first read
			lv.obj.Status.Limits = s.applyLimitsLocked(lv.obj, nil)
			lv.obj.Status.Rates = s.applyRatesLocked(lv.obj, nil)
			lv.obj.Status.ScrubSchedule = s.applyScrubScheduleLocked(lv.obj, nil)
		}
		s.vols[r.Name] = lv
	}
	sc, err := s.recoverSnapshots(f.Snapshots)
	if err != nil {
		return nil, err
	}
	if changed || sc {
		if err := s.saveLocked(); err != nil {
			return nil, err
		}
	}
	klog.InfoS("Opened the standalone volume store", "path", recordsPath, "volumes", len(s.vols), "nodeID", nodeID)
	return s, nil
}

// object is the Raid10Volume a record describes, without status.
func (r localRecord) object(rv string) *v1alpha1.Raid10Volume {
	v := &v1alpha1.Raid10Volume{Spec: r.Spec}
	v.Name, v.UID, v.Generation, v.CreationTimestamp = r.Name, r.UID, r.Generation, r.Created
	v.Annotations, v.Finalizers, v.ResourceVersion = r.Annotations, r.Finalizers, rv
	return v
}

// nextVersion returns a new resourceVersion. Called with s.mu held (or before s is shared).
func (s *LocalStore) nextVersion() string {
	s.version++
	return strconv.FormatInt(s.version, 10)
}

// saveLocked writes every record to the records file, atomically.
func (s *LocalStore) saveLocked() error {
	f := localRecords{Version: localRecordsVersion, Volumes: []localRecord{}}
	for _, lv := range s.vols {
		o := lv.obj
		f.Volumes = append(f.Volumes, localRecord{
			Name: o.Name, UID: o.UID, Generation: o.Generation, Created: o.CreationTimestamp,
			Annotations: o.Annotations, Finalizers: o.Finalizers, Spec: o.Spec,
			Provisioned: lv.provisioned, Deleting: lv.deleting,
		})
	}
	sort.Slice(f.Volumes, func(i, j int) bool { return f.Volumes[i].Name < f.Volumes[j].Name })
	f.Snapshots = s.snapshotRecordsLocked()
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("local store: encode records: %w", err)
	}
	if err := atomicfile.Write(s.path, b); err != nil {
		return fmt.Errorf("local store: %w", err)
	}
	return nil
}

// refreshLocked updates lv's status from the pool (ids: crstatus.DiskIDs of the pool's disks)
// and returns a copy of the object to hand out. A provisioned volume smaller than its spec
// gets its expansion retried first.
func (s *LocalStore) refreshLocked(lv *localVolume, ids map[string]string, now time.Time) *v1alpha1.Raid10Volume {
	vol := lv.obj
	if lv.deleting || !lv.provisioned {
		// Deleting: shows its DeletionTimestamp until the delete finishes. Not provisioned:
		// the pool refused it; the Failed status of the create stays (a pool volume of that
		// name, if any, is not this one).
		return vol.DeepCopy()
	}
	info, err := s.pool.Volume(vol.Name)
	switch {
	case errors.Is(err, pool.ErrNotFound):
		msg := "the volume was provisioned but is not in the node's pool (its disks are missing or were replaced)"
		vol.Status = crstatus.FailedStatus(vol.Status, vol, crstatus.ReasonNotInPool, msg, now)
		if vol.Status.Capacity == nil {
			// Held data once (statuses are not persisted): the controller must not delete
			// and recreate it blank.
			vol.Status.Capacity = resource.NewQuantity(vol.Spec.SizeBytes, resource.BinarySI)
		}
		return vol.DeepCopy()
	case err != nil:
		vol.Status = crstatus.FailedStatus(vol.Status, vol, crstatus.ReasonArrayFailed, err.Error(), now)
		return vol.DeepCopy()
	}
	expandMsg := ""
	if want := uint64(vol.Spec.SizeBytes); info.Size < want {
		if last, tried := s.expanded[vol.Name]; !tried || now.Sub(last) >= localExpandRetry {
			s.expanded[vol.Name] = now
			grown, err := s.pool.ExpandVolume(vol.Name, want)
			if err == nil {
				klog.InfoS("Volume expanded", "volumeID", vol.Name, "from", info.Size, "to", grown.Size)
				info = grown
			} else {
				klog.ErrorS(err, "Expanding the volume", "volumeID", vol.Name, "size", want)
				expandMsg = fmt.Sprintf("expansion to %d bytes pending: %v", want, err)
			}
		} else {
			expandMsg = fmt.Sprintf("expansion to %d bytes pending", want)
		}
	}
	if info.Size >= uint64(vol.Spec.SizeBytes) {
		delete(s.expanded, vol.Name)
	}
	st := crstatus.VolumeStatus(vol.Status, vol, info, ids, now)
	st.Limits = s.applyLimitsLocked(vol, vol.Status.Limits)
	st.Rates = s.applyRatesLocked(vol, vol.Status.Rates)
	st.ScrubSchedule = s.applyScrubScheduleLocked(vol, vol.Status.ScrubSchedule)
	if expandMsg != "" {
		st = crstatus.ExpandPending(st, expandMsg)
	}
	vol.Status = st
	return vol.DeepCopy()
}

// GetVolume implements VolumeStore.
func (s *LocalStore) GetVolume(_ context.Context, name string) (*v1alpha1.Raid10Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lv := s.vols[name]
	if lv == nil {
		return nil, fmt.Errorf("raid10volume %q: %w", name, ErrNotFound)
	}
	return s.refreshLocked(lv, crstatus.DiskIDs(s.pool.Disks()), time.Now()), nil
}

// ListVolumes implements VolumeStore.
func (s *LocalStore) ListVolumes(context.Context) ([]v1alpha1.Raid10Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids, now := crstatus.DiskIDs(s.pool.Disks()), time.Now()
	out := make([]v1alpha1.Raid10Volume, 0, len(s.vols))
	for _, lv := range s.vols {
		out = append(out, *s.refreshLocked(lv, ids, now))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// checkNew refuses a new object of kind (raid10volume, raid10snapshot) for another node or
// with a name the pool cannot hold.
func (s *LocalStore) checkNew(kind, name, node string) error {
	if node != s.nodeID {
		return fmt.Errorf("%s %q: node %q: the standalone plugin serves only node %q: %w", kind, name, node, s.nodeID, ErrInvalidArgument)
	}
	if err := pool.ValidateName(name); err != nil {
		return fmt.Errorf("%s %q: %w: %w", kind, name, ErrInvalidArgument, err)
	}
	return nil
}

// stampNew gives a new object what the API server would: a UID, generation 1 and its
// creation time.
func stampNew(m *metav1.ObjectMeta, now time.Time) {
	m.UID = uuid.NewUUID()
	m.Generation = 1
	m.CreationTimestamp = metav1.NewTime(now.Truncate(time.Second))
	m.DeletionTimestamp = nil
}

// CreateVolume implements VolumeStore: it records vol, then creates its pool volume at once.
func (s *LocalStore) CreateVolume(_ context.Context, vol *v1alpha1.Raid10Volume) error {
	if err := s.checkNew("raid10volume", vol.Name, vol.Spec.Node); err != nil {
		return err
	}
	if vol.Spec.SizeBytes <= 0 {
		return fmt.Errorf("raid10volume %q: spec.sizeBytes %d: must be positive: %w", vol.Name, vol.Spec.SizeBytes, ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vols[vol.Name] != nil {
		return fmt.Errorf("raid10volume %q: %w", vol.Name, ErrAlreadyExists)
	}
	now := time.Now()
	stampNew(&vol.ObjectMeta, now)
	vol.Status = v1alpha1.Raid10VolumeStatus{}
	lv := &localVolume{obj: vol.DeepCopy()}
	s.vols[vol.Name] = lv
	if err := s.saveLocked(); err != nil {
		delete(s.vols, vol.Name)
		return err
	}
	info, err := s.pool.CreateVolume(vol.Name, uint64(vol.Spec.SizeBytes), crstatus.CreateOptions(vol))
	if err != nil {
		reason, final := crstatus.CreateFailedReason(err)
		if !final {
			// I/O errors, a closed pool: nothing was created; forget the record.
			delete(s.vols, vol.Name)
			if serr := s.saveLocked(); serr != nil {
				klog.ErrorS(serr, "Dropping the record of a volume the pool did not create", "volumeID", vol.Name)
			}
			return fmt.Errorf("raid10volume %q: create in the pool: %w", vol.Name, err)
		}
		klog.ErrorS(err, "Volume cannot be provisioned", "volumeID", vol.Name, "reason", reason)
		lv.obj.Status = crstatus.FailedStatus(lv.obj.Status, lv.obj, reason, err.Error(), now)
	} else {
		lv.provisioned = true
		if err := s.saveLocked(); err != nil {
			// The volume exists in the pool; NewLocalStore marks such a record provisioned.
			return err
		}
		klog.InfoS("Volume provisioned", "volumeID", vol.Name, "size", info.Size, "members", len(info.Members))
	}
	lv.obj.ResourceVersion = s.nextVersion()
	vol.ResourceVersion = lv.obj.ResourceVersion
	return nil
}

// UpdateVolume implements VolumeStore: metadata and spec, guarded by the resourceVersion;
// the node and the layout are immutable and spec.sizeBytes never shrinks (the CRD's rules).
// A larger size is given to the pool at once.
func (s *LocalStore) UpdateVolume(_ context.Context, vol *v1alpha1.Raid10Volume) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	lv := s.vols[vol.Name]
	if lv == nil {
		return fmt.Errorf("raid10volume %q: %w", vol.Name, ErrNotFound)
	}
	cur := lv.obj
	if vol.ResourceVersion != cur.ResourceVersion {
		return fmt.Errorf("raid10volume %q: resourceVersion %q, the store has %q: %w", vol.Name, vol.ResourceVersion, cur.ResourceVersion, ErrConflict)
	}
	switch {
	case vol.Spec.Node != cur.Spec.Node:
		return fmt.Errorf("raid10volume %q: spec.node is immutable: %w", vol.Name, ErrInvalidArgument)
	case vol.Spec.Layout != cur.Spec.Layout:
		return fmt.Errorf("raid10volume %q: spec.layout is immutable: %w", vol.Name, ErrInvalidArgument)
	case vol.Spec.SizeBytes < cur.Spec.SizeBytes:
		return fmt.Errorf("raid10volume %q: spec.sizeBytes %d: must not shrink below %d: %w", vol.Name, vol.Spec.SizeBytes, cur.Spec.SizeBytes, ErrInvalidArgument)
	}
	next := cur.DeepCopy()
	next.Annotations, next.Labels, next.Finalizers = vol.Annotations, vol.Labels, vol.Finalizers
	if !equality.Semantic.DeepEqual(next.Spec, vol.Spec) {
		next.Spec = vol.Spec
		next.Generation++
	}
	old := lv.obj
	lv.obj = next
	if err := s.saveLocked(); err != nil {
		lv.obj = old
		return err
	}
	delete(s.expanded, vol.Name) // a new size is tried at once
	s.refreshLocked(lv, crstatus.DiskIDs(s.pool.Disks()), time.Now())
	next.ResourceVersion = s.nextVersion()
	vol.ResourceVersion, vol.Generation = next.ResourceVersion, next.Generation
	return nil
}

// DeleteVolume implements VolumeStore: the pool volume is deleted before the call returns.
// A missing volume is success.
func (s *LocalStore) DeleteVolume(_ context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	lv := s.vols[name]
	if lv == nil {
		return nil
	}
	if s.devices != nil {
		if dev := s.devices.Device(name); dev != "" {
			return fmt.Errorf("raid10volume %q is attached as %s (staged on this node): unstage it before deleting it: %w", name, dev, ErrFailedPrecondition)
		}
	}
	if !lv.deleting {
		lv.deleting = true
		t := metav1.NewTime(time.Now().Truncate(time.Second))
		lv.obj.DeletionTimestamp = &t
		lv.obj.ResourceVersion = s.nextVersion()
		if err := s.saveLocked(); err != nil {
			lv.deleting, lv.obj.DeletionTimestamp = false, nil
			return err
		}
	}
	if err := s.pool.DeleteVolume(name); err != nil {
		if errors.Is(err, pool.ErrFailedPrecondition) {
			// A clone or snapshot still copies from it; the record stays deleting, and
			// NewLocalStore or the next DeleteVolume finishes it.
			return fmt.Errorf("raid10volume %q: delete waits: %w: %w", name, ErrFailedPrecondition, err)
		}
		return fmt.Errorf("raid10volume %q: delete from the pool: %w", name, err)
	}
	delete(s.vols, name)
	delete(s.expanded, name)
	delete(s.limits, name)
	delete(s.rates, name)
	delete(s.scrubSchedules, name)
	if err := s.saveLocked(); err != nil {
		// The pool volume is gone; a restart finishes the delete from the deleting record.
		return err
	}
	klog.InfoS("Volume deleted", "volumeID", name)
	return nil
}

// AttachedDevices is the node's attacher (attach.PoolAttacher) as the local store's delete
// guard sees it.
type AttachedDevices interface {
	// Device returns the device path the volume is attached on, "" when it is not attached.
	Device(volumeID string) string
}

// UseDevices makes DeleteVolume refuse, with ErrFailedPrecondition, a volume that d reports
// attached (staged: a filesystem may be mounted on it), as the node agent waits for the
// detach in the cluster. Call it before the store is shared.
func (s *LocalStore) UseDevices(d AttachedDevices) { s.devices = d }

// GetNode implements VolumeStore: the node ID's Raid10Node, from the pool.
func (s *LocalStore) GetNode(_ context.Context, name string) (*v1alpha1.Raid10Node, error) {
	if name != s.nodeID {
		return nil, fmt.Errorf("raid10node %q: the standalone plugin serves only node %q: %w", name, s.nodeID, ErrNotFound)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.node = crstatus.NodeStatus(s.node, s.pool.Status(), s.pool.MemberFree(), time.Now())
	n := &v1alpha1.Raid10Node{Status: *s.node.DeepCopy()}
	n.Name = s.nodeID
	return n, nil
}

// ListNodes implements VolumeStore: the one Raid10Node of this node.
func (s *LocalStore) ListNodes(ctx context.Context) ([]v1alpha1.Raid10Node, error) {
	n, err := s.GetNode(ctx, s.nodeID)
	if err != nil {
		return nil, err
	}
	return []v1alpha1.Raid10Node{*n}, nil
}
