package agent_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestScrubRealAPIServer: a scrub asked for in spec.scrub (as `kubectl raid10 scrub` does)
// runs once per request on the agent's node and is answered in status.scrub with its
// progress and mismatches, with Events: a check counts a block whose copies differ, a
// repair rewrites it, the next check finds none; on a Degraded volume the request fails
// with the reason.
func TestScrubRealAPIServer(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()
	dir := t.TempDir()
	var pcfg pool.Config
	var paths []string
	for i := range 4 {
		p := filepath.Join(dir, "disk"+string(rune('0'+i))+".img")
		makeDisk(t, p, diskSize)
		paths = append(paths, p)
		pcfg.Disks = append(pcfg.Disks, pool.DiskConfig{Path: p})
	}
	pcfg.RebuildRateMax = 32 << 20 // a check of 64 MiB takes 2 s: progress shows
	pcfg.Scrub.Schedule = pool.ScrubOff
	pl, err := pool.Open(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx, cfg, agent.Options{NodeName: nodeName, Pool: pl}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	}()

	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	vol.Name = "pvc-scrub"
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "volume Ready", func() bool {
		return getVolume(t, c, vol.Name).Status.Phase == v1alpha1.VolumePhaseReady
	})

	// The volume's first block, then its second copy changed behind the engine's back.
	arr, err := pl.Array(vol.Name)
	if err != nil {
		t.Fatal(err)
	}
	block := bytes.Repeat([]byte{0x5a}, 4096)
	if _, err := arr.WriteAt(block, 0); err != nil {
		t.Fatal(err)
	}
	if err := arr.Flush(); err != nil {
		t.Fatal(err)
	}
	vi, _ := pl.Volume(vol.Name)
	f, err := os.OpenFile(vi.Members[1].DiskPath, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(vi.Members[1].Offset) + 1<<20 // the engine's metadata head
	got := make([]byte, 4096)
	if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, block) {
		t.Fatalf("member 1 at disk offset %d does not hold the first block (%v)", off, err)
	}
	if _, err := f.WriteAt(make([]byte, 4096), off); err != nil {
		t.Fatal(err)
	}
	f.Close()

	request := func(kind v1alpha1.ScrubKind, id string) *v1alpha1.ScrubStatus {
		t.Helper()
		v := getVolume(t, c, vol.Name)
		patch := client.MergeFrom(v.DeepCopy())
		v.Spec.Scrub = &v1alpha1.ScrubRequest{Kind: kind, Request: id}
		if err := c.Patch(ctx, v, patch); err != nil {
			t.Fatal(err)
		}
		var sc *v1alpha1.ScrubStatus
		sawRunning := false
		waitFor(t, time.Minute, "scrub "+id+" answered", func() bool {
			sc = getVolume(t, c, vol.Name).Status.Scrub
			if sc != nil && sc.Request == id && sc.State == v1alpha1.ScrubStateRunning {
				sawRunning = true
				if sc.TotalBytes != volumeSize || sc.DoneBytes > sc.TotalBytes {
					t.Errorf("progress %+v", sc)
				}
			}
			return sc != nil && sc.Request == id && sc.State != v1alpha1.ScrubStateRunning
		})
		t.Logf("scrub %s: %s %s, %d mismatches, %d repaired (running seen: %v)", id, sc.Kind, sc.State, sc.Mismatches, sc.Repaired, sawRunning)
		return sc
	}
	for _, tc := range []struct {
		kind       v1alpha1.ScrubKind
		id         string
		mismatches int64
		repaired   int64
	}{
		{v1alpha1.ScrubKindCheck, "r1", 1, 0},
		{v1alpha1.ScrubKindRepair, "r2", 1, 1},
		{"", "r3", 0, 0}, // check is the default
	} {
		sc := request(tc.kind, tc.id)
		if sc.State != v1alpha1.ScrubStateDone || sc.Mismatches != tc.mismatches || sc.Repaired != tc.repaired ||
			sc.Percent != 100 || sc.LastCompletedTime == nil || sc.FinishTime == nil || sc.StartTime == nil {
			t.Fatalf("scrub %s: %+v", tc.id, sc)
		}
	}

	// Nothing runs again for the same request: the agent acts on each once.
	before := *getVolume(t, c, vol.Name).Status.Scrub
	time.Sleep(time.Second)
	if after := getVolume(t, c, vol.Name).Status.Scrub; !after.StartTime.Equal(before.StartTime) {
		t.Fatalf("the same request ran twice: %+v, then %+v", before, after)
	}

	if err := pl.FailDisk(paths[3]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "Degraded", func() bool {
		return getVolume(t, c, vol.Name).Status.Health == v1alpha1.VolumeHealthDegraded
	})
	if sc := request(v1alpha1.ScrubKindCheck, "r4"); sc.State != v1alpha1.ScrubStateFailed || !strings.Contains(sc.Message, "in sync") ||
		sc.LastCompletedTime == nil {
		t.Fatalf("scrub of a Degraded volume: %+v", sc)
	}

	want := map[string]int{agent.EventScrubStarted: 3, agent.EventScrubMismatches: 2, agent.EventScrubFinished: 1, agent.EventScrubFailed: 1}
	waitFor(t, 10*time.Second, "scrub Events", func() bool {
		var l eventsv1.EventList
		if err := c.List(ctx, &l); err != nil {
			return false
		}
		n := map[string]int{}
		for _, e := range l.Items {
			if e.Regarding.Name == vol.Name {
				n[e.Reason]++
			}
		}
		for r, k := range want {
			if n[r] != k {
				return false
			}
		}
		return true
	})
}
