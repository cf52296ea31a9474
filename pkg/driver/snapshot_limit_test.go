package driver

import (
	"errors"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

func TestParseSnapshotParams(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    map[string]string
		max   int64
		bytes int64
		bad   string // the parameter the error must name
	}{
		{name: "None"},
		{name: "ExtraMetadata", in: map[string]string{paramSnapshotName: "a", paramSnapshotNamespace: "b", paramSnapshotContentName: "c"}},
		{name: "Set", in: map[string]string{ParamMaxSnapshots: "3", ParamMaxSnapshotBytesPerNode: "500Gi"}, max: 3, bytes: 500 << 30},
		{name: "ZeroIsNoLimit", in: map[string]string{ParamMaxSnapshots: "0", ParamMaxSnapshotBytesPerNode: "0"}},
		{name: "MaxNegative", in: map[string]string{ParamMaxSnapshots: "-1"}, bad: ParamMaxSnapshots},
		{name: "MaxNotANumber", in: map[string]string{ParamMaxSnapshots: "many"}, bad: ParamMaxSnapshots},
		{name: "BytesGarbage", in: map[string]string{ParamMaxSnapshotBytesPerNode: "lots"}, bad: ParamMaxSnapshotBytesPerNode},
		{name: "BytesNegative", in: map[string]string{ParamMaxSnapshotBytesPerNode: "-1Gi"}, bad: ParamMaxSnapshotBytesPerNode},
		{name: "LayoutRefused", in: map[string]string{ParamMembers: "2"}, bad: ParamMembers},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := parseSnapshotParams(tc.in)
			if tc.bad != "" {
				if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.bad) {
					t.Fatalf("err = %v, want InvalidArgument naming %s", err, tc.bad)
				}
				return
			}
			if err != nil || l.maxSnapshots != tc.max || l.maxBytesPerNode != tc.bytes {
				t.Fatalf("parseSnapshotParams = %+v, %v; want max %d, bytes %d", l, err, tc.max, tc.bytes)
			}
		})
	}
}

func TestParseParamsMaxSnapshots(t *testing.T) {
	p, err := parseParams(map[string]string{ParamMaxSnapshots: "2"})
	if err != nil || p.maxSnapshots != "2" {
		t.Fatalf("parseParams(maxSnapshots=2) = %+v, %v", p, err)
	}
	for _, v := range []string{"-2", "two", "1.5"} {
		if _, err := parseParams(map[string]string{ParamMaxSnapshots: v}); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), ParamMaxSnapshots) {
			t.Errorf("parseParams(maxSnapshots=%s) = %v, want InvalidArgument naming it", v, err)
		}
	}
}

// snapshotLimitSuite is part of snapshotSuite (fake and real API server): node-a holds
// pvc-src (2 GiB) with its snapshot-1; the limits refuse with ResourceExhausted, naming the
// limit, where it is set, the use and the volume, and leave no object. It deletes what it
// made.
func snapshotLimitSuite(t *testing.T, c client.Client, cc csi.ControllerClient) {
	ctx := t.Context()
	withParams := func(name, source string, kv ...string) *csi.CreateSnapshotRequest {
		r := snapReq(name, source)
		for i := 0; i+1 < len(kv); i += 2 {
			r.Parameters[kv[i]] = kv[i+1]
		}
		return r
	}
	refused := func(t *testing.T, r *csi.CreateSnapshotRequest, sub string) {
		t.Helper()
		_, err := cc.CreateSnapshot(ctx, r)
		wantCode(t, err, codes.ResourceExhausted, sub)
		var s v1alpha1.Raid10Snapshot
		if err := c.Get(ctx, client.ObjectKey{Name: r.Name}, &s); client.IgnoreNotFound(err) != nil || err == nil {
			t.Fatalf("refused snapshot %s left an object: %v", r.Name, err)
		}
	}
	deleteSnapshot := func(id string) {
		if _, err := cc.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id}); err != nil {
			t.Errorf("DeleteSnapshot(%s): %v", id, err)
		}
	}

	// The StorageClass's maxSnapshots=1 reaches CreateSnapshot through the volume.
	r := createReq("pvc-limited", gib, "node-a")
	r.Parameters[ParamMaxSnapshots] = "1"
	if _, err := cc.CreateVolume(ctx, r); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-limited"}); err != nil {
			t.Error(err)
		}
	}()
	if _, err := cc.CreateSnapshot(ctx, snapReq("snapshot-lim-1", "pvc-limited")); err != nil {
		t.Fatal(err)
	}
	defer deleteSnapshot("snapshot-lim-1")
	refused(t, snapReq("snapshot-lim-2", "pvc-limited"),
		`volume "pvc-limited" holds 1 snapshot(s), the most that maxSnapshots=1 (StorageClass parameter) allows`)
	// The class may lower it, never raise it.
	refused(t, withParams("snapshot-lim-2", "pvc-limited", ParamMaxSnapshots, "5"), "maxSnapshots=1 (StorageClass parameter)")
	// A retry of the snapshot that exists is no new one.
	if _, err := cc.CreateSnapshot(ctx, snapReq("snapshot-lim-1", "pvc-limited")); err != nil {
		t.Fatalf("retry of snapshot-lim-1 under its limit: %v", err)
	}

	// The VolumeSnapshotClass's maxSnapshots: pvc-src has snapshot-1.
	refused(t, withParams("snapshot-cls", "pvc-src", ParamMaxSnapshots, "1"),
		`volume "pvc-src" holds 1 snapshot(s), the most that maxSnapshots=1 (VolumeSnapshotClass parameter) allows`)

	// Per node: snapshot-1 (2 GiB) and snapshot-lim-1 (1 GiB) hold 3 GiB on node-a.
	refused(t, withParams("snapshot-node", "pvc-src", ParamMaxSnapshotBytesPerNode, "4Gi"),
		`node "node-a": its snapshots hold 3Gi; one more of volume "pvc-src" (2Gi) would pass maxSnapshotBytesPerNode=4Gi`)
	if _, err := cc.CreateSnapshot(ctx, withParams("snapshot-node", "pvc-src", ParamMaxSnapshotBytesPerNode, "5Gi", ParamMaxSnapshots, "2")); err != nil {
		t.Fatalf("snapshot within maxSnapshotBytesPerNode=5Gi and maxSnapshots=2: %v", err)
	}
	deleteSnapshot("snapshot-node")

	_, err := cc.CreateSnapshot(ctx, withParams("snapshot-bad", "pvc-src", ParamMaxSnapshots, "-1"))
	wantCode(t, err, codes.InvalidArgument, ParamMaxSnapshots)
	bad := createReq("pvc-bad-limit", gib, "node-a")
	bad.Parameters[ParamMaxSnapshots] = "some"
	_, err = cc.CreateVolume(ctx, bad)
	wantCode(t, err, codes.InvalidArgument, ParamMaxSnapshots)
}
