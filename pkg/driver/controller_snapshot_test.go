package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

func snapReq(name, source string) *csi.CreateSnapshotRequest {
	return &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source, Parameters: map[string]string{
		paramSnapshotName: "snap", paramSnapshotNamespace: "default", paramSnapshotContentName: "snapcontent-" + name}}
}

func fromSnapshot(r *csi.CreateVolumeRequest, id string) *csi.CreateVolumeRequest {
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	return r
}

func fromVolume(r *csi.CreateVolumeRequest, id string) *csi.CreateVolumeRequest {
	r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	return r
}

// snapshotSuite is the controller's snapshot, restore and clone behaviour, over the client
// of controllerSuite (fake or real API server) with its test agent. It leaves no object and
// gives every byte back.
func snapshotSuite(t *testing.T, c client.Client, cc csi.ControllerClient, agent *testAgent) {
	ctx := t.Context()
	onA := &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-a"}}}
	before, err := cc.GetCapacity(ctx, onA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.CreateVolume(ctx, createReq("pvc-src", 2*gib, "node-a")); err != nil {
		t.Fatal(err)
	}

	t.Run("CutAtOnceThenReadyOnRetry", func(t *testing.T) {
		agent.setCopying(true)
		first, err := cc.CreateSnapshot(ctx, snapReq("snapshot-1", "pvc-src"))
		if err != nil {
			t.Fatal(err)
		}
		s := first.GetSnapshot()
		if s.GetSnapshotId() != "snapshot-1" || s.GetSourceVolumeId() != "pvc-src" || s.GetReadyToUse() ||
			s.GetSizeBytes() != 2*gib || s.GetCreationTime().AsTime().IsZero() {
			t.Fatalf("first CreateSnapshot = %v, want snapshot-1 of pvc-src, not ready, 2 GiB, a creation time", s)
		}
		var obj v1alpha1.Raid10Snapshot
		if err := c.Get(ctx, client.ObjectKey{Name: "snapshot-1"}, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Spec.Node != "node-a" || obj.Finalizers[0] != v1alpha1.VolumeFinalizer ||
			obj.Annotations[v1alpha1.VolumeSnapshotContentNameAnnotation] != "snapcontent-snapshot-1" {
			t.Fatalf("Raid10Snapshot = %+v", obj)
		}
		again, err := cc.CreateSnapshot(ctx, snapReq("snapshot-1", "pvc-src"))
		if err != nil || again.GetSnapshot().GetReadyToUse() || !again.GetSnapshot().GetCreationTime().AsTime().Equal(s.GetCreationTime().AsTime()) {
			t.Fatalf("retry while copying = %v, %v; want the same cut, not ready", again, err)
		}
		agent.setCopying(false)
		waitFor(t, func() bool {
			r, err := cc.CreateSnapshot(ctx, snapReq("snapshot-1", "pvc-src"))
			return err == nil && r.GetSnapshot().GetReadyToUse() && r.GetSnapshot().GetCreationTime().AsTime().Equal(s.GetCreationTime().AsTime())
		})
	})

	t.Run("SnapshotErrors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			req  *csi.CreateSnapshotRequest
			code codes.Code
			sub  string
		}{
			{"NoName", snapReq("", "pvc-src"), codes.InvalidArgument, "name"},
			{"NoSource", snapReq("snapshot-x", ""), codes.InvalidArgument, "source_volume_id"},
			{"UnknownSource", snapReq("snapshot-x", "pvc-nope"), codes.NotFound, "pvc-nope"},
			{"SameNameOtherSource", snapReq("snapshot-1", "pvc-other"), codes.AlreadyExists, "pvc-src"},
			{"Parameter", &csi.CreateSnapshotRequest{Name: "snapshot-x", SourceVolumeId: "pvc-src", Parameters: map[string]string{"members": "2"}}, codes.InvalidArgument, "members"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := cc.CreateSnapshot(ctx, tc.req)
				wantCode(t, err, tc.code, tc.sub)
			})
		}
		t.Run("NoRoomNothingLeft", func(t *testing.T) {
			agent.setSnapFail(v1alpha1.ReasonInsufficientCapacity)
			defer agent.setSnapFail("")
			_, err := cc.CreateSnapshot(ctx, snapReq("snapshot-full", "pvc-src"))
			wantCode(t, err, codes.ResourceExhausted, "snapshot-full")
			waitFor(t, func() bool {
				var s v1alpha1.Raid10Snapshot
				return client.IgnoreNotFound(c.Get(ctx, client.ObjectKey{Name: "snapshot-full"}, &s)) == nil && s.Name == ""
			})
		})
		t.Run("TooBigForFreeSpace", func(t *testing.T) {
			if _, err := cc.CreateVolume(ctx, createReq("pvc-huge", 8*gib, "node-a")); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-huge"}); err != nil {
					t.Error(err)
				}
			}()
			// 20 GiB - 2 (pvc-src) - 2 (snapshot-1) - 8 = 8 GiB free: one more 8 GiB copy fits, two do not.
			if _, err := cc.CreateSnapshot(ctx, snapReq("snapshot-huge-1", "pvc-huge")); err != nil {
				t.Fatal(err)
			}
			_, err := cc.CreateSnapshot(ctx, snapReq("snapshot-huge-2", "pvc-huge"))
			wantCode(t, err, codes.ResourceExhausted, "free")
			var s v1alpha1.Raid10Snapshot
			if err := c.Get(ctx, client.ObjectKey{Name: "snapshot-huge-2"}, &s); client.IgnoreNotFound(err) != nil || err == nil {
				t.Fatalf("refused snapshot left an object: %v", err)
			}
			if _, err := cc.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snapshot-huge-1"}); err != nil {
				t.Fatal(err)
			}
		})
	})

	t.Run("Limits", func(t *testing.T) { snapshotLimitSuite(t, c, cc) })

	t.Run("ListSnapshots", func(t *testing.T) {
		if _, err := cc.CreateVolume(ctx, createReq("pvc-src2", gib, "node-a")); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"snapshot-2", "snapshot-3"} {
			if _, err := cc.CreateSnapshot(ctx, snapReq(n, "pvc-src2")); err != nil {
				t.Fatal(err)
			}
		}
		all, err := cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
		if err != nil || len(all.GetEntries()) != 3 {
			t.Fatalf("ListSnapshots = %v, %v; want 3", all, err)
		}
		bySource, err := cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: "pvc-src2"})
		if err != nil || len(bySource.GetEntries()) != 2 {
			t.Fatalf("ListSnapshots(source pvc-src2) = %v, %v; want 2", bySource, err)
		}
		byID, err := cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: "snapshot-3"})
		if err != nil || len(byID.GetEntries()) != 1 || byID.GetEntries()[0].GetSnapshot().GetSourceVolumeId() != "pvc-src2" {
			t.Fatalf("ListSnapshots(id snapshot-3) = %v, %v", byID, err)
		}
		none, err := cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: "snapshot-none"})
		if err != nil || len(none.GetEntries()) != 0 {
			t.Fatalf("ListSnapshots(unknown id) = %v, %v; want empty", none, err)
		}
		var ids []string
		tok := ""
		for range 3 {
			page, err := cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{MaxEntries: 2, StartingToken: tok})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range page.GetEntries() {
				ids = append(ids, e.GetSnapshot().GetSnapshotId())
			}
			if tok = page.GetNextToken(); tok == "" {
				break
			}
		}
		if len(ids) != 3 || ids[0] != "snapshot-1" || ids[2] != "snapshot-3" {
			t.Fatalf("pages of 2 gave %v", ids)
		}
		_, err = cc.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "7"})
		wantCode(t, err, codes.Aborted, "starting_token")
	})

	t.Run("RestoreAndClone", func(t *testing.T) {
		resp, err := cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-restore", 2*gib, "node-a"), "snapshot-1"))
		if err != nil {
			t.Fatal(err)
		}
		v := resp.GetVolume()
		if v.GetContentSource().GetSnapshot().GetSnapshotId() != "snapshot-1" || v.GetAccessibleTopology()[0].GetSegments()[v1alpha1.TopologyNodeKey] != "node-a" {
			t.Fatalf("restore = %v", v)
		}
		var vol v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: "pvc-restore"}, &vol); err != nil || vol.Spec.Source == nil || vol.Spec.Source.Snapshot != "snapshot-1" {
			t.Fatalf("Raid10Volume pvc-restore = %+v, %v", vol.Spec, err)
		}
		// Idempotent by name and source.
		if _, err := cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-restore", 2*gib, "node-a"), "snapshot-1")); err != nil {
			t.Fatal(err)
		}
		clone, err := cc.CreateVolume(ctx, fromVolume(createReq("pvc-clone", 2*gib, "node-a"), "pvc-src"))
		if err != nil || clone.GetVolume().GetContentSource().GetVolume().GetVolumeId() != "pvc-src" {
			t.Fatalf("clone = %v, %v", clone, err)
		}
		// Without any topology requirement the source's node is taken.
		free, err := cc.CreateVolume(ctx, fromVolume(&csi.CreateVolumeRequest{Name: "pvc-clone-free", VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4")},
			Parameters: map[string]string{ParamMembers: "4"}}, "pvc-src2"))
		if err != nil || free.GetVolume().GetAccessibleTopology()[0].GetSegments()[v1alpha1.TopologyNodeKey] != "node-a" || free.GetVolume().GetCapacityBytes() != gib {
			t.Fatalf("clone without topology = %v, %v; want node-a, the source's 1 GiB", free, err)
		}
		for _, id := range []string{"pvc-restore", "pvc-clone", "pvc-clone-free"} {
			if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("RestoreErrors", func(t *testing.T) {
		agent.setCopying(true)
		if _, err := cc.CreateSnapshot(ctx, snapReq("snapshot-copying", "pvc-src2")); err != nil {
			t.Fatal(err)
		}
		agent.setCopying(false)
		for _, tc := range []struct {
			name string
			req  *csi.CreateVolumeRequest
			code codes.Code
			sub  string
		}{
			{"UnknownSnapshot", fromSnapshot(createReq("pvc-r1", 2*gib, "node-a"), "snapshot-nope"), codes.NotFound, "snapshot-nope"},
			{"UnknownVolume", fromVolume(createReq("pvc-r2", 2*gib, "node-a"), "pvc-nope"), codes.NotFound, "pvc-nope"},
			{"Smaller", fromSnapshot(createReq("pvc-r3", gib, "node-a"), "snapshot-1"), codes.OutOfRange, "snapshot snapshot-1"},
			{"LimitSmaller", func() *csi.CreateVolumeRequest {
				r := fromVolume(createReq("pvc-r4", 0, "node-a"), "pvc-src")
				r.CapacityRange = &csi.CapacityRange{LimitBytes: gib}
				return r
			}(), codes.OutOfRange, "limit_bytes"},
			{"OtherNode", fromSnapshot(createReq("pvc-r5", 2*gib, "node-b"), "snapshot-1"), codes.ResourceExhausted, `on node "node-a"`},
			{"CloneOtherNode", fromVolume(createReq("pvc-r6", 2*gib, "node-b"), "pvc-src"), codes.ResourceExhausted, `on node "node-a"`},
			{"EmptySnapshotID", fromSnapshot(createReq("pvc-r7", 2*gib, "node-a"), ""), codes.InvalidArgument, "snapshot_id"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := cc.CreateVolume(ctx, tc.req)
				wantCode(t, err, tc.code, tc.sub)
				var v v1alpha1.Raid10Volume
				if err := c.Get(ctx, client.ObjectKey{Name: tc.req.Name}, &v); err == nil {
					t.Fatalf("refused CreateVolume left Raid10Volume %s", v.Name)
				}
			})
		}
		if _, err := cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-r8", gib, "node-a"), "snapshot-copying")); grpcstatus.Code(err) != codes.DeadlineExceeded {
			// The test agent finished the copy meanwhile only if it ran between the calls;
			// either way a restore never starts from a snapshot that is not ready.
			if err == nil {
				t.Log("snapshot-copying became ready before the restore; restore accepted")
				if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-r8"}); err != nil {
					t.Fatal(err)
				}
			} else {
				t.Fatalf("restore from a snapshot not ready: %v", err)
			}
		}
		if _, err := cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-restore", 2*gib, "node-a"), "snapshot-1")); err != nil {
			t.Fatal(err)
		}
		_, err := cc.CreateVolume(ctx, fromVolume(createReq("pvc-restore", 2*gib, "node-a"), "pvc-src"))
		wantCode(t, err, codes.AlreadyExists, "snapshot snapshot-1")
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-restore"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("DeleteOrder", func(t *testing.T) {
		agent.setCopying(true)
		if _, err := cc.CreateVolume(ctx, fromSnapshot(createReq("pvc-hydrating", 2*gib, "node-a"), "snapshot-1")); err != nil {
			t.Fatal(err)
		}
		_, err := cc.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snapshot-1"})
		wantCode(t, err, codes.FailedPrecondition, "pvc-hydrating")
		if _, err := cc.CreateVolume(ctx, fromVolume(createReq("pvc-cloning", 2*gib, "node-a"), "pvc-src")); err != nil {
			t.Fatal(err)
		}
		_, err = cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-src"})
		wantCode(t, err, codes.FailedPrecondition, "pvc-cloning")
		if _, err := cc.CreateSnapshot(ctx, snapReq("snapshot-4", "pvc-src2")); err != nil {
			t.Fatal(err)
		}
		_, err = cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-src2"})
		wantCode(t, err, codes.FailedPrecondition, "snapshot-4")
		for _, name := range []string{"snapshot-1", "pvc-src", "pvc-src2"} {
			var obj client.Object = &v1alpha1.Raid10Volume{}
			if name == "snapshot-1" {
				obj = &v1alpha1.Raid10Snapshot{}
			}
			if err := c.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil || obj.GetDeletionTimestamp() != nil {
				t.Fatalf("%s after a refused delete: %v, deletion %v; want untouched", name, err, obj.GetDeletionTimestamp())
			}
		}
		agent.setCopying(false)
		// Sources first, then what was made from them: every order works once copied.
		waitFor(t, func() bool {
			_, err := cc.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "snapshot-1"})
			return err == nil
		})
		for _, id := range []string{"pvc-src", "pvc-src2", "pvc-hydrating", "pvc-cloning"} {
			waitFor(t, func() bool {
				_, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
				return err == nil
			})
		}
		for _, id := range []string{"snapshot-2", "snapshot-3", "snapshot-4", "snapshot-copying", "snapshot-1", "never-existed"} {
			if _, err := cc.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
				t.Fatalf("DeleteSnapshot(%s): %v", id, err)
			}
		}
		_, err = cc.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{})
		wantCode(t, err, codes.InvalidArgument, "snapshot_id")
		var snaps v1alpha1.Raid10SnapshotList
		if err := c.List(ctx, &snaps); err != nil || len(snaps.Items) != 0 {
			t.Fatalf("snapshots left: %v, %v", snaps.Items, err)
		}
		after, err := cc.GetCapacity(ctx, onA)
		if err != nil || after.GetAvailableCapacity() != before.GetAvailableCapacity() {
			t.Fatalf("GetCapacity after the deletes = %v, %v; want %d as before", after, err, before.GetAvailableCapacity())
		}
	})
}
