package agent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func getSnapshot(t *testing.T, c client.Client, name string) *v1alpha1.Raid10Snapshot {
	t.Helper()
	var s v1alpha1.Raid10Snapshot
	if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &s); err != nil {
		t.Fatalf("get Raid10Snapshot %s: %v", name, err)
	}
	return &s
}

// eventReasons lists the reasons of the Events about the object named name.
func eventReasons(t *testing.T, c client.Client, name string) []string {
	t.Helper()
	var l eventsv1.EventList
	if err := c.List(t.Context(), &l); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l.Items {
		if e.Regarding.Name == name {
			out = append(out, e.Reason)
		}
	}
	return out
}

// TestAgentSnapshotsRealAPIServer runs the agent against a real kube-apiserver and a pool on
// four sparse files, copies rate-limited so that they take seconds: a Raid10Snapshot is cut
// (cutAt, Copying, its finalizer), reports its progress and turns Ready; a restore
// (spec.source) is Ready at once and reports its hydration; deleting the snapshot while the
// restore copies from it waits (phase Deleting, message, Event DeleteWaiting) and completes
// after; a snapshot of a volume the pool does not have, and one with no room, are Failed
// with their reasons and nothing allocated; the Raid10Node's free space comes back.
func TestAgentSnapshotsRealAPIServer(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()
	dir := t.TempDir()
	pcfg := fileDisks(t, dir, 4)
	pcfg.RebuildRateMax = 8 << 20 // a 64 MiB copy takes about 8 s
	pl, err := pool.Open(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(actx, cfg, agent.Options{NodeName: nodeName, Pool: pl, PollInterval: 200 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	}()
	var freeAtStart int64
	waitFor(t, time.Minute, "Raid10Node", func() bool {
		n, err := getNode(c, ctx)
		freeAtStart = n.Status.Capacity.Free.Value()
		return err == nil && n.Status.DiskCount == 4
	})

	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	vol.Name = "pvc-src"
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "source Ready", func() bool { return getVolume(t, c, "pvc-src").Status.Phase == v1alpha1.VolumePhaseReady })

	snap := &v1alpha1.Raid10Snapshot{Spec: v1alpha1.Raid10SnapshotSpec{Source: "pvc-src", Node: nodeName}}
	snap.Name = "snapshot-1"
	other := snap.DeepCopy()
	other.Name, other.Spec.Node = "snapshot-other-node", "node-b"
	for _, s := range []*v1alpha1.Raid10Snapshot{snap, other} {
		if err := c.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var percents []int32
	d := waitFor(t, time.Minute, "snapshot cut", func() bool { return getSnapshot(t, c, "snapshot-1").Status.CutAt != nil })
	s := getSnapshot(t, c, "snapshot-1")
	t.Logf("cut reported %v after the create: phase %s, %d%%, size %d, members %d", d.Round(time.Millisecond), s.Status.Phase, s.Status.Percent, s.Status.SizeBytes, s.Status.Members)
	if !slices.Contains(s.Finalizers, v1alpha1.VolumeFinalizer) || s.Status.SizeBytes != volumeSize || s.Status.Health != v1alpha1.VolumeHealthHealthy {
		t.Fatalf("snapshot after the cut: finalizers %v, status %+v", s.Finalizers, s.Status)
	}
	cut := s.Status.CutAt.Time
	d = waitFor(t, time.Minute, "snapshot ready", func() bool {
		s := getSnapshot(t, c, "snapshot-1")
		if len(percents) == 0 || percents[len(percents)-1] != s.Status.Percent {
			percents = append(percents, s.Status.Percent)
		}
		return s.Status.ReadyToUse
	})
	s = getSnapshot(t, c, "snapshot-1")
	t.Logf("ready %v later; progress seen %v", d.Round(time.Millisecond), percents)
	if s.Status.Phase != v1alpha1.SnapshotPhaseReady || s.Status.Percent != 100 || s.Status.CopiedBytes != volumeSize || !s.Status.CutAt.Time.Equal(cut) {
		t.Fatalf("ready snapshot: %+v", s.Status)
	}
	if cond := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady); cond == nil || cond.Status != "True" || cond.Reason != crstatus.ReasonCopied {
		t.Fatalf("Ready condition: %+v", cond)
	}
	if len(percents) < 3 {
		t.Errorf("progress seen %v: want the copy's progress reported on the way", percents)
	}
	if _, err := pl.Snapshot("snapshot-other-node"); err == nil {
		t.Fatal("the agent cut another node's snapshot")
	}

	// A restore: Ready at once, hydration reported, then hydrated.
	restore := vol.DeepCopy()
	restore.Name, restore.ResourceVersion, restore.Spec.Source = "pvc-restore", "", &v1alpha1.VolumeSource{Snapshot: "snapshot-1"}
	if err := c.Create(ctx, restore); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "restore Ready", func() bool {
		v := getVolume(t, c, "pvc-restore")
		return v.Status.Phase == v1alpha1.VolumePhaseReady && v.Status.Hydration != nil
	})
	if h := getVolume(t, c, "pvc-restore").Status.Hydration; h.Hydrated {
		t.Logf("restore hydrated before the first look: %+v", h)
	}
	// Deleting the snapshot while the restore copies from it waits.
	if err := c.Delete(ctx, getSnapshot(t, c, "snapshot-1")); err != nil {
		t.Fatal(err)
	}
	sawWaiting := false
	waitFor(t, time.Minute, "snapshot deleted", func() bool {
		var s v1alpha1.Raid10Snapshot
		err := c.Get(ctx, client.ObjectKey{Name: "snapshot-1"}, &s)
		if err == nil && s.Status.Phase == v1alpha1.SnapshotPhaseDeleting && s.Status.Message != "" {
			if !sawWaiting {
				t.Logf("delete waits: %s", s.Status.Message)
			}
			sawWaiting = true
			if h := getVolume(t, c, "pvc-restore").Status.Hydration; h.Hydrated && h.Percent != 100 {
				t.Errorf("hydration %+v", h)
			}
		}
		return apierrors.IsNotFound(err)
	})
	v := getVolume(t, c, "pvc-restore")
	if h := v.Status.Hydration; h == nil || !h.Hydrated || h.Percent != 100 || h.CopiedBytes != h.TotalBytes {
		t.Fatalf("restore after the snapshot went: hydration %+v", v.Status.Hydration)
	}
	if !sawWaiting {
		t.Error("the snapshot's delete never waited for the restore's copy (the copy ended before the delete)")
	}
	reasons := eventReasons(t, c, "snapshot-1")
	for _, want := range []string{agent.EventSnapshotCut, agent.EventSnapshotReady, agent.EventDeleteWaiting, agent.EventSnapshotDeleted} {
		if !slices.Contains(reasons, want) {
			t.Errorf("Events of snapshot-1: %v, want %s", reasons, want)
		}
	}
	if !slices.Contains(eventReasons(t, c, "pvc-restore"), agent.EventHydrated) {
		t.Errorf("Events of pvc-restore: %v, want %s", eventReasons(t, c, "pvc-restore"), agent.EventHydrated)
	}

	// Refusals: no such source; no room for a copy of a volume that fills half the pool.
	bad := snap.DeepCopy()
	bad.Name, bad.ResourceVersion, bad.Spec.Source = "snapshot-nosource", "", "pvc-nope"
	if err := c.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	big := vol.DeepCopy()
	big.Name, big.ResourceVersion = "pvc-big", ""
	big.Spec.SizeBytes = int64(pl.Capacity().LargestVolume) * 3 / 4 / (1 << 20) * (1 << 20)
	if err := c.Create(ctx, big); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "big volume Ready", func() bool { return getVolume(t, c, "pvc-big").Status.Phase == v1alpha1.VolumePhaseReady })
	full := snap.DeepCopy()
	full.Name, full.ResourceVersion, full.Spec.Source = "snapshot-full", "", "pvc-big"
	if err := c.Create(ctx, full); err != nil {
		t.Fatal(err)
	}
	for name, reason := range map[string]string{"snapshot-nosource": v1alpha1.ReasonSourceNotFound, "snapshot-full": v1alpha1.ReasonInsufficientCapacity} {
		waitFor(t, 30*time.Second, name+" Failed", func() bool { return getSnapshot(t, c, name).Status.Phase == v1alpha1.SnapshotPhaseFailed })
		s := getSnapshot(t, c, name)
		if cond := meta.FindStatusCondition(s.Status.Conditions, v1alpha1.ConditionReady); cond == nil || cond.Reason != reason || s.Status.CutAt != nil {
			t.Errorf("%s: Ready condition %+v, cut %v; want reason %s, no cut", name, cond, s.Status.CutAt, reason)
		}
		if _, err := pl.Snapshot(name); err == nil {
			t.Errorf("%s: the pool has it", name)
		}
		if !slices.Contains(eventReasons(t, c, name), agent.EventSnapshotFailed) {
			t.Errorf("%s: no %s Event", name, agent.EventSnapshotFailed)
		}
	}

	// Everything goes; the node's free space is back.
	for _, o := range []client.Object{bad, full, other, getVolume(t, c, "pvc-big"), getVolume(t, c, "pvc-restore"), getVolume(t, c, "pvc-src")} {
		if err := c.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	// The other node's snapshot keeps its finalizer-free object: nobody added one.
	waitFor(t, time.Minute, "objects gone", func() bool {
		var sl v1alpha1.Raid10SnapshotList
		var vl v1alpha1.Raid10VolumeList
		return c.List(ctx, &sl) == nil && c.List(ctx, &vl) == nil && len(sl.Items) == 0 && len(vl.Items) == 0
	})
	waitFor(t, 10*time.Second, "free space back", func() bool {
		n, err := getNode(c, ctx)
		return err == nil && n.Status.Capacity.Free.Value() == freeAtStart
	})
	if len(pl.Snapshots()) != 0 || len(pl.Volumes()) != 0 {
		t.Fatalf("pool after the deletes: snapshots %v, volumes %v", pl.Snapshots(), pl.Volumes())
	}
}
