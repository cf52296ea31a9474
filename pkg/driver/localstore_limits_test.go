package driver

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestLocalStoreLimits: without an API server (--mode=all) the store plays the agent's part
// for QoS limits: CreateVolume's and ControllerModifyVolume's limits reach the array and
// status.limits, and a store opened again over a pool opened afresh (which keeps limits in
// memory only) puts them on again before anything reads the volume.
func TestLocalStoreLimits(t *testing.T) {
	p, cfg := openFilePool(t, 256<<20)
	records := filepath.Join(t.TempDir(), LocalRecordsFile)
	c := &ControllerServer{store: openLocalStore(t, p, records), locks: &VolumeLocks{}, readyTimeout: 5 * time.Second, pollInterval: 10 * time.Millisecond}
	ctx := context.Background()
	inForce := func(t *testing.T, p *pool.Pool, want raid10.Limits) {
		t.Helper()
		a, err := p.Array("pvc-qos")
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Status().Limits; got != want {
			t.Fatalf("array limits %+v, want %+v", got, want)
		}
	}

	req := createReq("pvc-qos", 16<<20, localNode)
	req.Parameters = map[string]string{ParamMembers: "2", ParamMaxWriteIOPS: "200", ParamMaxWriteIOPSBurst: "20"}
	if _, err := c.CreateVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	inForce(t, p, raid10.Limits{WriteIOPS: 200, WriteIOPSBurst: 20})

	if _, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-qos",
		MutableParameters: map[string]string{ParamMaxReadBytesPerSecond: "4Mi", ParamMaxReadBytesBurst: "1Mi"}}); err != nil {
		t.Fatal(err)
	}
	both := raid10.Limits{WriteIOPS: 200, WriteIOPSBurst: 20, ReadBytesPerSecond: 4 << 20, ReadBytesBurst: 1 << 20}
	inForce(t, p, both)
	vol, err := c.store.GetVolume(ctx, "pvc-qos")
	if err != nil {
		t.Fatal(err)
	}
	if want := (v1alpha1.VolumeLimits{WriteIOPS: 200, WriteIOPSBurst: 20, ReadBytesPerSecond: 4 << 20, ReadBytesBurst: 1 << 20}); vol.Status.Limits == nil || *vol.Status.Limits != want {
		t.Fatalf("status.limits %+v, want %+v", vol.Status.Limits, want)
	}

	p2 := reopenPool(t, p, cfg)
	openLocalStore(t, p2, records)
	inForce(t, p2, both)
}
