package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestAgentRatesRealAPIServer: a Raid10Volume's spec.rates reach the engine over the node's
// (the array's rates in force) and show in status.rates; a change is applied live; after a
// restart of the agent with a pool opened afresh (the pool keeps rates in memory only) the
// agent puts them on again although status.rates already shows them; removing spec.rates
// returns the array to the node's rates. spec.scrubSchedule goes the same way, on the same
// volume and API server (scheduled): pool.VolumeScrubSchedule has it (defaults filled in)
// and status.scrubSchedule shows it; created, changed live, reapplied after the restart,
// removed -> the node's.
func TestAgentRatesRealAPIServer(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()
	pcfg := fileDisks(t, t.TempDir(), 4)
	pcfg.RebuildRateMax = 100 << 20
	start := func() (*pool.Pool, func()) {
		pl, err := pool.Open(pcfg)
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- agent.Run(actx, cfg, agent.Options{NodeName: nodeName, Pool: pl}) }()
		return pl, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent.Run: %v", err)
			}
			if err := pl.Close(); err != nil {
				t.Errorf("pool Close: %v", err)
			}
		}
	}
	node := raid10.Rates{SyncMin: raid10.DefaultSyncRateMin, SyncMax: 100 << 20}
	first := v1alpha1.VolumeRates{RebuildRateMax: 20 << 20, ScrubRateMax: 5 << 20}
	second := v1alpha1.VolumeRates{RebuildRateMin: 2 << 20, ScrubRateMax: 1 << 20}
	// applied waits until the array has inForce and status.rates is want.
	applied := func(pl *pool.Pool, name string, want *v1alpha1.VolumeRates, inForce raid10.Rates) time.Duration {
		t.Helper()
		return waitFor(t, 30*time.Second, fmt.Sprintf("rates %+v on the array and %+v in status", inForce, want), func() bool {
			a, err := pl.Array(name)
			if err != nil || a.Rates() != inForce {
				return false
			}
			st := getVolume(t, c, name).Status
			return (st.Rates == nil) == (want == nil) && (want == nil || *st.Rates == *want)
		})
	}

	firstSched := &v1alpha1.VolumeScrubSchedule{Schedule: "weekly", Start: "02:00", Window: "4h", Repair: true}
	secondSched := &v1alpha1.VolumeScrubSchedule{Schedule: "off"}
	secondInPool := &pool.ScrubConfig{Schedule: "off", Start: pool.DefaultScrubStart, Window: pool.Duration(pool.DefaultScrubWindow)}
	// scheduled waits until the pool has inPool as the volume's schedule and
	// status.scrubSchedule is want.
	scheduled := func(pl *pool.Pool, name string, want *v1alpha1.VolumeScrubSchedule, inPool *pool.ScrubConfig) {
		t.Helper()
		waitFor(t, 30*time.Second, fmt.Sprintf("scrub schedule %+v in the pool and %+v in status", inPool, want), func() bool {
			got, err := pl.VolumeScrubSchedule(name)
			if err != nil || (got == nil) != (inPool == nil) || (got != nil && *got != *inPool) {
				return false
			}
			return equality.Semantic.DeepEqual(getVolume(t, c, name).Status.ScrubSchedule, want)
		})
	}

	pl, stop := start()
	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 64 << 10}, Rates: first.DeepCopy(), ScrubSchedule: firstSched.DeepCopy(),
	}}
	vol.Name = "pvc-rates"
	vol.Finalizers = []string{v1alpha1.VolumeFinalizer}
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	el := applied(pl, vol.Name, &first, raid10.Rates{SyncMin: raid10.DefaultSyncRateMin, SyncMax: 20 << 20, ScrubMax: 5 << 20})
	t.Logf("created with rates: applied after %v", el.Round(time.Millisecond))
	scheduled(pl, vol.Name, firstSched, &pool.ScrubConfig{Schedule: "weekly", Start: "02:00", Window: pool.Duration(4 * time.Hour), Repair: true})

	v := getVolume(t, c, vol.Name)
	v.Spec.Rates = second.DeepCopy()
	v.Spec.ScrubSchedule = secondSched.DeepCopy()
	if err := c.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	secondInForce := raid10.Rates{SyncMin: 2 << 20, SyncMax: 100 << 20, ScrubMax: 1 << 20}
	t.Logf("changed live: applied after %v", applied(pl, vol.Name, &second, secondInForce).Round(time.Millisecond))
	scheduled(pl, vol.Name, secondSched, secondInPool)
	stop()

	pl, stop = start()
	defer stop()
	t.Logf("after a restart: applied again after %v", applied(pl, vol.Name, &second, secondInForce).Round(time.Millisecond))
	scheduled(pl, vol.Name, secondSched, secondInPool)

	v = getVolume(t, c, vol.Name)
	v.Spec.Rates = nil
	v.Spec.ScrubSchedule = nil
	if err := c.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	applied(pl, vol.Name, nil, node)
	scheduled(pl, vol.Name, nil, nil)
	if err := c.Delete(ctx, getVolume(t, c, vol.Name)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "volume deleted", func() bool {
		var l v1alpha1.Raid10VolumeList
		return c.List(ctx, &l) == nil && len(l.Items) == 0
	})
}
