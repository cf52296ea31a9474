package driver

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// listStore is a VolumeStore that only lists (nodeFree's reads of a store without node scope).
type listStore struct {
	VolumeStore
	vols  []v1alpha1.Raid10Volume
	snaps []v1alpha1.Raid10Snapshot
}

func (s *listStore) ListVolumes(context.Context) ([]v1alpha1.Raid10Volume, error) {
	return s.vols, nil
}

func (s *listStore) ListSnapshots(context.Context) ([]v1alpha1.Raid10Snapshot, error) {
	return s.snaps, nil
}

// fullMeta is metadata with everything a real object carries and the cache does not need.
func fullMeta(name string, deleted bool) metav1.ObjectMeta {
	m := metav1.ObjectMeta{
		Name: name, UID: "uid-" + "x", ResourceVersion: "42", Generation: 3,
		Labels: map[string]string{"app.kubernetes.io/managed-by": "raid10-csi", "raid10.csi.io/node": "n1"},
		Annotations: map[string]string{v1alpha1.CSINameAnnotation: "pvc-" + name, v1alpha1.PVCNameAnnotation: "data-" + name,
			v1alpha1.PVCNamespaceAnnotation: "db", v1alpha1.PVNameAnnotation: "pvc-" + name},
		Finalizers:    []string{v1alpha1.VolumeFinalizer},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "raid10-csi", Operation: metav1.ManagedFieldsOperationUpdate}},
	}
	if deleted {
		t := metav1.NewTime(time.Unix(1_800_000_000, 0))
		m.DeletionTimestamp = &t
	}
	return m
}

func fullVolume(name, node string, size int64, phase v1alpha1.VolumePhase, deleted bool) v1alpha1.Raid10Volume {
	v := v1alpha1.Raid10Volume{ObjectMeta: fullMeta(name, deleted)}
	v.Spec = v1alpha1.Raid10VolumeSpec{
		Node: node, SizeBytes: size, VolumeMode: v1alpha1.VolumeModeFilesystem, FSType: "xfs",
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: DefaultChunkSizeBytes},
	}
	v.Status.Phase, v.Status.Health, v.Status.InSync = phase, v1alpha1.VolumeHealthHealthy, "4/4"
	if phase != v1alpha1.VolumePhasePending {
		q := resource.NewQuantity(size, resource.BinarySI)
		v.Status.Capacity = q
	}
	for i := range 4 {
		v.Status.Members = append(v.Status.Members, v1alpha1.MemberStatus{
			Index: int32(i), Disk: fmt.Sprintf("nvme%dn1-serial-%08d", i, i), State: v1alpha1.MemberStateInSync, Message: "in sync"})
	}
	v.Status.DevicePath = "/dev/nbd3"
	return v
}

func fullSnapshot(name, node, source string, phase v1alpha1.SnapshotPhase, cut, deleted bool) v1alpha1.Raid10Snapshot {
	s := v1alpha1.Raid10Snapshot{ObjectMeta: fullMeta(name, deleted)}
	s.Spec = v1alpha1.Raid10SnapshotSpec{Node: node, Source: source}
	s.Status.Phase, s.Status.Members, s.Status.Message = phase, 4, "copying member 2"
	if cut {
		t := metav1.NewTime(time.Unix(1_700_000_000, 0))
		s.Status.CutAt = &t
	}
	s.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "Copying", Message: "copying"}}
	return s
}

// TestCapacityTransformsKeepWhatNodeFreeReads: the capacity cache's transforms drop most of a
// Raid10Volume and a Raid10Snapshot (issue 28: the cache is the controller's memory per
// volume), so GetCapacity must answer the same from the slim objects as from the whole ones,
// on a node where each field nodeFree reads decides something: a volume not allocated yet
// (phase Pending) counts, one allocated does not, one being deleted does not, one of another
// node does not; a snapshot not cut yet counts its source's capacity, a cut or failed or
// deleted one does not. The transforms are idempotent and pass other objects through.
func TestCapacityTransformsKeepWhatNodeFreeReads(t *testing.T) {
	const gib = int64(1 << 30)
	node := &v1alpha1.Raid10Node{}
	node.Name = "n1"
	for i := range 4 {
		node.Status.Disks = append(node.Status.Disks, v1alpha1.DiskStatus{
			ID: fmt.Sprintf("d%d", i), SizeBytes: 100 * gib, FreeBytes: 60 * gib, State: v1alpha1.DiskStateHealthy})
	}
	full := &listStore{
		vols: []v1alpha1.Raid10Volume{
			fullVolume("pending", "n1", 2*gib, v1alpha1.VolumePhasePending, false),
			fullVolume("unset", "n1", 3*gib, "", false),
			fullVolume("source", "n1", 5*gib, v1alpha1.VolumePhaseReady, false),
			fullVolume("pending-deleted", "n1", 7*gib, v1alpha1.VolumePhasePending, true),
			fullVolume("pending-elsewhere", "n2", 11*gib, v1alpha1.VolumePhasePending, false),
		},
		snaps: []v1alpha1.Raid10Snapshot{
			fullSnapshot("uncut", "n1", "source", v1alpha1.SnapshotPhasePending, false, false),
			fullSnapshot("cut", "n1", "source", v1alpha1.SnapshotPhaseCopying, true, false),
			fullSnapshot("failed", "n1", "source", v1alpha1.SnapshotPhaseFailed, false, false),
			fullSnapshot("deleted", "n1", "source", v1alpha1.SnapshotPhasePending, false, true),
			fullSnapshot("elsewhere", "n2", "source", v1alpha1.SnapshotPhasePending, false, false),
		},
	}
	slim := &listStore{}
	var fullBytes, slimBytes int
	for i := range full.vols {
		o, err := capacityVolume(&full.vols[i])
		if err != nil {
			t.Fatal(err)
		}
		v := o.(*v1alpha1.Raid10Volume)
		again, _ := capacityVolume(v.DeepCopy())
		if !reflect.DeepEqual(again, v) {
			t.Fatalf("capacityVolume is not idempotent:\n%+v\n%+v", v, again)
		}
		slim.vols = append(slim.vols, *v)
		fullBytes += jsonLen(t, &full.vols[i])
		slimBytes += jsonLen(t, v)
	}
	for i := range full.snaps {
		o, err := capacitySnapshot(&full.snaps[i])
		if err != nil {
			t.Fatal(err)
		}
		s := o.(*v1alpha1.Raid10Snapshot)
		again, _ := capacitySnapshot(s.DeepCopy())
		if !reflect.DeepEqual(again, s) {
			t.Fatalf("capacitySnapshot is not idempotent:\n%+v\n%+v", s, again)
		}
		slim.snaps = append(slim.snaps, *s)
		fullBytes += jsonLen(t, &full.snaps[i])
		slimBytes += jsonLen(t, s)
	}
	ctx := t.Context()
	want := 60*gib*4/2 - 2*gib - 3*gib - 5*gib // pending, unset, the uncut snapshot of source
	for name, store := range map[string]VolumeStore{"whole": full, "slim": slim} {
		got, err := nodeFree(ctx, store, node, 4, "")
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("nodeFree from the %s objects: %d, want %d", name, got, want)
		}
		got, err = nodeFree(ctx, store, node, 4, "pending")
		if err != nil {
			t.Fatal(err)
		}
		if got != want+2*gib {
			t.Errorf("nodeFree from the %s objects, except the pending volume: %d, want %d", name, got, want+2*gib)
		}
	}
	if slimBytes*3 > fullBytes {
		t.Errorf("the slim objects encode to %d bytes, the whole ones to %d: the transforms keep more than a third", slimBytes, fullBytes)
	}
	t.Logf("whole objects %d bytes of JSON, slim %d", fullBytes, slimBytes)

	n := node.DeepCopy()
	for _, f := range []func(any) (any, error){capacityVolume, capacitySnapshot} {
		if o, err := f(n); err != nil || o != any(n) {
			t.Errorf("a transform changed a Raid10Node: %v, %v", o, err)
		}
	}
	// The cache's one transform: each kind to its own, a node only without managed fields.
	if o, _ := capacityTransform(full.vols[0].DeepCopy()); !reflect.DeepEqual(o, &slim.vols[0]) {
		t.Errorf("capacityTransform of a volume: %+v, want %+v", o, &slim.vols[0])
	}
	if o, _ := capacityTransform(full.snaps[0].DeepCopy()); !reflect.DeepEqual(o, &slim.snaps[0]) {
		t.Errorf("capacityTransform of a snapshot: %+v, want %+v", o, &slim.snaps[0])
	}
	n.ManagedFields = fullMeta("n1", false).ManagedFields
	o, err := capacityTransform(n)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.(*v1alpha1.Raid10Node); got.ManagedFields != nil || !reflect.DeepEqual(got.Status, node.Status) {
		t.Errorf("capacityTransform of a node: managed fields %v, status %+v; want none and the node's status", got.ManagedFields, got.Status)
	}
}

func jsonLen(t *testing.T, o any) int {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}
