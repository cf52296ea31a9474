package driver

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestLocalStoreRates: without an API server (--mode=all) the store plays the agent's part
// for the rebuild and scrub rates: CreateVolume's and ControllerModifyVolume's rates reach the
// array over the node's and status.rates, and a store opened again over a pool opened afresh
// (which keeps rates in memory only) puts them on again before anything reads the volume.
// The scrub schedule goes the same way on the same volume (status.scrubSchedule and
// pool.VolumeScrubSchedule), and scrubSchedule "node" returns it to the node's.
func TestLocalStoreRates(t *testing.T) {
	p, cfg := openFilePool(t, 256<<20)
	records := filepath.Join(t.TempDir(), LocalRecordsFile)
	c := &ControllerServer{store: openLocalStore(t, p, records), locks: &VolumeLocks{}, readyTimeout: 5 * time.Second, pollInterval: 10 * time.Millisecond}
	ctx := context.Background()
	inForce := func(t *testing.T, p *pool.Pool, want raid10.Rates) {
		t.Helper()
		a, err := p.Array("pvc-rates")
		if err != nil {
			t.Fatal(err)
		}
		if got := a.Rates(); got != want {
			t.Fatalf("array rates %+v, want %+v", got, want)
		}
	}
	// scheduled checks the pool's schedule for the volume (first: before a read of the
	// volume could apply it) and then status.scrubSchedule.
	scheduled := func(t *testing.T, p *pool.Pool, want *v1alpha1.VolumeScrubSchedule) {
		t.Helper()
		got, err := p.VolumeScrubSchedule("pvc-rates")
		var inPool *pool.ScrubConfig
		if want != nil {
			inPool = &pool.ScrubConfig{Schedule: want.Schedule, Start: pool.DefaultScrubStart, Window: pool.Duration(pool.DefaultScrubWindow), Repair: want.Repair}
		}
		if err != nil || (got == nil) != (inPool == nil) || (got != nil && *got != *inPool) {
			t.Fatalf("pool scrub schedule %+v, %v; want %+v", got, err, inPool)
		}
		vol, err := c.store.GetVolume(ctx, "pvc-rates")
		if err != nil || !equality.Semantic.DeepEqual(vol.Status.ScrubSchedule, want) {
			t.Fatalf("status.scrubSchedule %+v, %v; want %+v", vol.Status.ScrubSchedule, err, want)
		}
	}

	req := createReq("pvc-rates", 16<<20, localNode)
	req.Parameters = map[string]string{ParamMembers: "2", ParamRebuildRateMax: "30Mi", ParamScrubSchedule: "weekly"}
	if _, err := c.CreateVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	inForce(t, p, raid10.Rates{SyncMin: raid10.DefaultSyncRateMin, SyncMax: 30 << 20})

	if _, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-rates",
		MutableParameters: map[string]string{ParamScrubRateMax: "3Mi", ParamScrubRepair: "true"}}); err != nil {
		t.Fatal(err)
	}
	weekly := &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Repair: true}
	scheduled(t, p, weekly)
	both := raid10.Rates{SyncMin: raid10.DefaultSyncRateMin, SyncMax: 30 << 20, ScrubMax: 3 << 20}
	inForce(t, p, both)
	vol, err := c.store.GetVolume(ctx, "pvc-rates")
	if err != nil {
		t.Fatal(err)
	}
	if want := (v1alpha1.VolumeRates{RebuildRateMax: 30 << 20, ScrubRateMax: 3 << 20}); vol.Status.Rates == nil || *vol.Status.Rates != want {
		t.Fatalf("status.rates %+v, want %+v", vol.Status.Rates, want)
	}

	p2 := reopenPool(t, p, cfg)
	c.store = openLocalStore(t, p2, records)
	inForce(t, p2, both)
	scheduled(t, p2, weekly)

	if _, err := c.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: "pvc-rates",
		MutableParameters: map[string]string{ParamScrubSchedule: "node"}}); err != nil {
		t.Fatal(err)
	}
	scheduled(t, p2, nil)
}
