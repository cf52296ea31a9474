package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// TestClusterSnapshots: a snapshot and a restore made through the custom resources, cut and
// copied by the real node agent over a pool of file disks, as `kubectl raid10 snapshots`
// and `describe volume` show them.
func TestClusterSnapshots(t *testing.T) {
	cl := startCluster(t)
	ctx := t.Context()
	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: clusterNode, SizeBytes: clusterVol, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	vol.Name = "pvc-s1"
	if err := cl.c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	cl.waitFor(time.Minute, "pvc-s1 Ready", func() bool { return cl.volume("pvc-s1").Status.Phase == v1alpha1.VolumePhaseReady })
	snap := &v1alpha1.Raid10Snapshot{Spec: v1alpha1.Raid10SnapshotSpec{Source: "pvc-s1", Node: clusterNode}}
	snap.Name = "snapshot-s1"
	snap.Annotations = map[string]string{v1alpha1.VolumeSnapshotNamespaceAnnotation: "apps", v1alpha1.VolumeSnapshotNameAnnotation: "nightly"}
	if err := cl.c.Create(ctx, snap); err != nil {
		t.Fatal(err)
	}
	cl.waitFor(time.Minute, "snapshot-s1 ready", func() bool {
		return cl.c.Get(ctx, client.ObjectKeyFromObject(snap), snap) == nil && snap.Status.ReadyToUse
	})
	out := cl.kubectlOK("snapshots")
	line := lineOf(out, "snapshot-s1")
	for _, want := range []string{"pvc-s1", clusterNode, "Ready", "ready", "apps/nightly"} {
		if !strings.Contains(line, want) {
			t.Errorf("snapshots: line %q lacks %q:\n%s", line, want, out)
		}
	}
	if out := cl.kubectlOK("snapshots", "pvc-other"); strings.Contains(out, "snapshot-s1") {
		t.Errorf("snapshots pvc-other lists snapshot-s1:\n%s", out)
	}
	var list struct {
		Items []v1alpha1.Raid10Snapshot `json:"items"`
	}
	if err := json.Unmarshal([]byte(cl.kubectlOK("snapshots", "-o", "json")), &list); err != nil || len(list.Items) != 1 || list.Items[0].Status.Percent != 100 {
		t.Fatalf("snapshots -o json: %+v, %v", list, err)
	}
	out = cl.kubectlOK("describe", "volume", "pvc-s1")
	if !strings.Contains(out, "Snapshots:     1") || !strings.Contains(lineOf(out, "  snapshot-s1"), "Ready, ready, cut") {
		t.Errorf("describe volume pvc-s1 lacks its snapshot:\n%s", out)
	}

	restore := &v1alpha1.Raid10Volume{Spec: vol.Spec}
	restore.Spec.Source = &v1alpha1.VolumeSource{Snapshot: "snapshot-s1"}
	restore.Name = "pvc-s1-restore"
	if err := cl.c.Create(ctx, restore); err != nil {
		t.Fatal(err)
	}
	cl.waitFor(time.Minute, "pvc-s1-restore hydrated", func() bool {
		h := cl.volume("pvc-s1-restore").Status.Hydration
		return h != nil && h.Hydrated
	})
	out = cl.kubectlOK("describe", "volume", "pvc-s1-restore")
	for _, want := range []string{"Source:        snapshot snapshot-s1 (a restore)", "hydrated: independent of the source", "Snapshots:     (none)"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe volume pvc-s1-restore lacks %q:\n%s", want, out)
		}
	}
	for _, o := range []client.Object{restore, snap, vol} {
		if err := cl.c.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cl.waitFor(time.Minute, "objects gone", func() bool {
		out, err := cl.kubectl("snapshots")
		return err == nil && strings.Contains(out, "(no Raid10Snapshot)") && len(cl.pool.Volumes()) == 0
	})
}

// TestLocalSnapshots: --local snapshots lists the pool's snapshots with their copy progress
// (the pool opened from its configuration, no agent).
func TestLocalSnapshots(t *testing.T) {
	_, o := setup(t, 4)
	runOK(t, o, "create", "v1", "32Mi")
	b, err := os.ReadFile(o.PoolConfig)
	if err != nil {
		t.Fatal(err)
	}
	var cfg pool.Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	p, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateSnapshot("snap-1", "v1"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if s, err := p.Snapshot("snap-1"); err == nil && s.Ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("snap-1 not ready within a minute")
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	out := runOK(t, o, "snapshots")
	if line := lineOf(out, "snap-1"); !strings.Contains(line, "v1") || !strings.Contains(line, "ready") || !strings.Contains(line, "32MiB") {
		t.Fatalf("snapshots:\n%s", out)
	}
	var snaps []pool.SnapshotInfo
	if err := json.Unmarshal([]byte(runOK(t, o, "snapshots", "v2", "-o", "json")), &snaps); err != nil || len(snaps) != 0 {
		t.Fatalf("snapshots v2 -o json: %+v, %v", snaps, err)
	}
}
