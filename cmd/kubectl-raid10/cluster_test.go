package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	nodeagent "github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func TestHealthRank(t *testing.T) {
	vol := func(h v1alpha1.VolumeHealth, p v1alpha1.VolumePhase) v1alpha1.Raid10Volume {
		return v1alpha1.Raid10Volume{Status: v1alpha1.Raid10VolumeStatus{Health: h, Phase: p}}
	}
	order := []v1alpha1.Raid10Volume{
		vol(v1alpha1.VolumeHealthFailed, v1alpha1.VolumePhaseReady),
		vol(v1alpha1.VolumeHealthDegraded, v1alpha1.VolumePhaseReady),
		vol(v1alpha1.VolumeHealthRebuilding, v1alpha1.VolumePhaseReady),
		vol("", v1alpha1.VolumePhasePending),
		vol(v1alpha1.VolumeHealthHealthy, v1alpha1.VolumePhaseReady),
	}
	for i := 1; i < len(order); i++ {
		if healthRank(order[i-1]) >= healthRank(order[i]) {
			t.Fatalf("%+v does not come before %+v", order[i-1].Status, order[i].Status)
		}
	}
}

// TestClusterModeErrors: commands that need a node's pool, bad usage and an unreadable
// kubeconfig fail with errors that say so, before any API call.
func TestClusterModeErrors(t *testing.T) {
	o := &Options{Output: "table", RunDir: "/nonexistent", Kubeconfig: filepath.Join(t.TempDir(), "missing")}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"LocalOnly", []string{"create", "v", "1Gi"}, "--local"},
		{"Unknown", []string{"frobnicate"}, "unknown command"},
		{"DescribeWhat", []string{"describe", "pod", "x"}, `unknown kind "pod"`},
		{"ReplaceUsage", []string{"replace-disk", "node-a", "d1"}, "usage: replace-disk NODE"},
		{"BadOutput", []string{"status", "-o", "wide"}, "must be table, json or yaml"},
		{"NoKubeconfig", []string{"status"}, "kubeconfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			oo := *o
			err := run(context.Background(), &oo, tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: error %v, want one containing %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestClusterMode runs every cluster command against a real kube-apiserver with the chart's
// CRDs and the real node agent over a pool of file disks: status, volumes, disks and
// describe (tables, JSON, YAML) through a volume's life; a failed disk replaced with
// replace-disk, the rebuild followed as a progress bar to Healthy; a refused replacement;
// errors that name the unknown node, disk or volume.
func TestClusterMode(t *testing.T) {
	cl := startCluster(t)
	ctx := t.Context()

	// A second node, written by hand as its agent would: one disk failed, and two volumes
	// on it, one Healthy, one Degraded, named so that by name the Healthy one comes first.
	nb := &v1alpha1.Raid10Node{}
	nb.Name = "node-b"
	if err := cl.c.Create(ctx, nb); err != nil {
		t.Fatal(err)
	}
	nb.Status = v1alpha1.Raid10NodeStatus{
		Disks: []v1alpha1.DiskStatus{
			{ID: "WWN-B0", Path: "/dev/nvme0n1", SizeBytes: 1 << 40, FreeBytes: 1 << 39, State: v1alpha1.DiskStateHealthy},
			{ID: "WWN-B1", Path: "/dev/nvme1n1", SizeBytes: 1 << 40, State: v1alpha1.DiskStateFailed, Message: "failed: I/O error"},
		},
		DiskCount: 2, HealthyDisks: 1,
		Capacity: v1alpha1.NodeCapacity{Raw: resource.MustParse("1Ti"), Usable: resource.MustParse("512Gi"), Free: resource.MustParse("256Gi")},
	}
	if err := cl.c.Status().Update(ctx, nb); err != nil {
		t.Fatal(err)
	}
	handVol := func(name string, health v1alpha1.VolumeHealth, inSync string, bad, lost int64) {
		v := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
			Node: "node-b", SizeBytes: 1 << 30, VolumeMode: v1alpha1.VolumeModeBlock,
			Layout: v1alpha1.Layout{Members: 2, ChunkSizeBytes: 512 << 10},
		}}
		v.Name = name
		if err := cl.c.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		v.Status = v1alpha1.Raid10VolumeStatus{Phase: v1alpha1.VolumePhaseReady, Health: health, InSync: inSync,
			Capacity: resource.NewQuantity(1<<30, resource.BinarySI), BadBlocks: bad, LostBlocks: lost,
			Members: []v1alpha1.MemberStatus{
				{Index: 0, Disk: "WWN-B0", State: v1alpha1.MemberStateInSync, BadBlocks: bad, Timeouts: 2},
				{Index: 1, Disk: "WWN-B1", State: v1alpha1.MemberStateFailed},
			}}
		if err := cl.c.Status().Update(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	handVol("b-healthy", v1alpha1.VolumeHealthHealthy, "2/2", 0, 0)
	handVol("b-degraded", v1alpha1.VolumeHealthDegraded, "1/2", 7, 2)

	// node-a's volume, provisioned by the real agent.
	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: clusterNode, SizeBytes: clusterVol, VolumeMode: v1alpha1.VolumeModeFilesystem, FSType: v1alpha1.FSTypeExt4,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	vol.Name = "pvc-a1"
	vol.Annotations = map[string]string{v1alpha1.PVCNamespaceAnnotation: "apps", v1alpha1.PVCNameAnnotation: "data-db-0"}
	if err := cl.c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	cl.waitFor(30*time.Second, "pvc-a1 Healthy", func() bool {
		return cl.volume(vol.Name).Status.Health == v1alpha1.VolumeHealthHealthy
	})
	// The Raid10Node follows the allocation asynchronously: wait until it shows the pool's
	// free capacity after it, so that the checks below compare settled figures.
	cl.waitFor(10*time.Second, "node-a free capacity after pvc-a1", func() bool {
		return cl.node(clusterNode).Status.Capacity.Free.Value() == int64(cl.pool.Capacity().LargestVolume)
	})

	t.Run("Status", func(t *testing.T) {
		out := cl.kubectlOK("status")
		t.Logf("status:\n%s", out)
		for _, want := range []string{"2 nodes, 5/6 disks healthy; 3 volumes: 2 Healthy, 1 Degraded", "NODE", "VOLUME"} {
			if !strings.Contains(out, want) {
				t.Fatalf("status lacks %q", want)
			}
		}
		if f := strings.Fields(lineOf(out, "node-a ")); len(f) < 5 || f[1] != "4/4" || f[4] != "True" {
			t.Fatalf("node-a row: %q", f)
		}
		if f := strings.Fields(lineOf(out, "node-b ")); len(f) < 4 || f[1] != "1/2" || f[2] != "512GiB" || f[3] != "256GiB" {
			t.Fatalf("node-b row: %q", f)
		}
		// Degraded first, then the Healthy ones by name.
		deg, healthy, a1 := lineIndex(out, "b-degraded "), lineIndex(out, "b-healthy "), lineIndex(out, "pvc-a1 ")
		if deg < 0 || healthy < 0 || a1 < 0 || deg > healthy || healthy > a1 {
			t.Fatalf("volume order: b-degraded at %d, b-healthy at %d, pvc-a1 at %d", deg, healthy, a1)
		}
		if f := strings.Fields(lineOf(out, "b-degraded ")); len(f) < 7 || f[4] != "1/2" || f[5] != "7" || f[6] != "(2" {
			t.Fatalf("b-degraded row (bad blocks 7, 2 lost): %q", f)
		}
		if f := strings.Fields(lineOf(out, "b-healthy ")); len(f) < 6 || f[5] != "0" {
			t.Fatalf("b-healthy row (no bad blocks): %q", f)
		}
		var ov clusterOverview
		if err := json.Unmarshal([]byte(cl.kubectlOK("status", "-o", "json")), &ov); err != nil {
			t.Fatal(err)
		}
		if len(ov.Nodes) != 2 || len(ov.Volumes) != 3 || ov.Volumes[0].Name != "b-degraded" || ov.Nodes[0].HealthyDisks != 4 ||
			ov.Volumes[0].BadBlocks != 7 || ov.Volumes[0].LostBlocks != 2 ||
			ov.Nodes[0].FreeBytes != cl.node(clusterNode).Status.Capacity.Free.Value() {
			t.Fatalf("status -o json: %+v", ov)
		}
		var ovy clusterOverview
		if err := yaml.Unmarshal([]byte(cl.kubectlOK("status", "-o", "yaml")), &ovy); err != nil || len(ovy.Volumes) != 3 {
			t.Fatalf("status -o yaml: %+v, %v", ovy, err)
		}
	})

	t.Run("Volumes", func(t *testing.T) {
		out := cl.kubectlOK("volumes")
		t.Logf("volumes:\n%s", out)
		f := strings.Fields(lineOf(out, "pvc-a1 "))
		if len(f) < 10 || f[1] != clusterNode || f[2] != "64MiB" || f[3] != "Ready" || f[4] != "Healthy" || f[5] != "4/4" || f[6] != "0" || f[7] != "-" || f[8] != "apps/data-db-0" {
			t.Fatalf("pvc-a1 row: %q", f)
		}
		if l := lineOf(out, "b-degraded "); !strings.Contains(l, " 1/2 ") || !strings.Contains(l, " 7 (2 lost) ") {
			t.Fatalf("b-degraded row: %q", l)
		}
		var list struct {
			Kind  string                  `json:"kind"`
			Items []v1alpha1.Raid10Volume `json:"items"`
		}
		if err := json.Unmarshal([]byte(cl.kubectlOK("volumes", "pvc-a1", "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		if list.Kind != "Raid10VolumeList" || len(list.Items) != 1 || list.Items[0].Status.InSync != "4/4" {
			t.Fatalf("volumes pvc-a1 -o json: %+v", list)
		}
		if err := yaml.Unmarshal([]byte(cl.kubectlOK("volumes", "-o", "yaml")), &list); err != nil || len(list.Items) != 3 {
			t.Fatalf("volumes -o yaml: %d items, %v", len(list.Items), err)
		}
		_, err := cl.kubectl("volumes", "pvc-nope")
		if !errors.Is(err, errNotFound) || !strings.Contains(err.Error(), `unknown volume "pvc-nope"`) {
			t.Fatalf("unknown volume: %v", err)
		}
	})

	t.Run("Disks", func(t *testing.T) {
		out := cl.kubectlOK("disks")
		t.Logf("disks:\n%s", out)
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) >= 6 && f[0] == clusterNode {
				n++
				if f[3] != "Healthy" || f[4] != "256MiB" || f[5] == "0B" {
					t.Fatalf("node-a disk row: %q", f)
				}
			}
		}
		if n != 4 {
			t.Fatalf("%d disk rows of node-a, want 4", n)
		}
		if f := strings.Fields(lineOf(out, "node-b  WWN-B1")); len(f) < 7 || f[3] != "Failed" || !strings.Contains(lineOf(out, "node-b  WWN-B1"), "failed: I/O error") {
			t.Fatalf("node-b failed disk row: %q", f)
		}
		var list struct {
			Items []v1alpha1.Raid10Node `json:"items"`
		}
		if err := yaml.Unmarshal([]byte(cl.kubectlOK("disks", "node-b", "-o", "yaml")), &list); err != nil || len(list.Items) != 1 || len(list.Items[0].Status.Disks) != 2 {
			t.Fatalf("disks node-b -o yaml: %+v, %v", list, err)
		}
		_, err := cl.kubectl("disks", "node-x")
		if !errors.Is(err, errNotFound) || !strings.Contains(err.Error(), `unknown node "node-x"`) || !strings.Contains(err.Error(), "node-a, node-b") {
			t.Fatalf("unknown node: %v", err)
		}
	})

	// A disk fails: the volume is Degraded; replace-disk drives the pool's replacement
	// through the Raid10Node spec; the rebuild shows as a progress bar, then Healthy.
	failed := cl.disks[1]
	failedID := cl.diskID(failed)
	if err := cl.pool.FailDisk(failed); err != nil {
		t.Fatal(err)
	}
	cl.waitFor(10*time.Second, "pvc-a1 Degraded", func() bool {
		return cl.volume(vol.Name).Status.Health == v1alpha1.VolumeHealthDegraded
	})
	cl.waitFor(10*time.Second, "failed disk reported", func() bool { return cl.node(clusterNode).Status.HealthyDisks == 3 })
	if out := cl.kubectlOK("status"); lineIndex(out, "pvc-a1 ") > lineIndex(out, "b-healthy ") {
		t.Fatalf("the Degraded pvc-a1 is not listed before the Healthy volumes:\n%s", out)
	}

	t.Run("ReplaceDiskErrors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			want string
		}{
			{"UnknownNode", []string{"replace-disk", "node-x", failedID, cl.disks[4]}, `unknown node "node-x"`},
			{"UnknownDisk", []string{"replace-disk", clusterNode, "nvme-nope", cl.disks[4]}, `unknown disk "nvme-nope" on node node-a`},
			{"HealthyDisk", []string{"replace-disk", clusterNode, cl.disks[0], cl.disks[4]}, "is Healthy"},
			{"RelativePath", []string{"replace-disk", clusterNode, failedID, "disk4.img"}, "must be a device path"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := cl.kubectl(tc.args...)
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want one containing %q", err, tc.want)
				}
			})
		}
		if n := cl.node(clusterNode); n.Spec.DiskReplacement != nil {
			t.Fatalf("a refused command wrote a request: %+v", n.Spec.DiskReplacement)
		}
	})

	t.Run("ReplaceDisk", func(t *testing.T) {
		start := time.Now()
		out := cl.kubectlOK("replace-disk", clusterNode, failedID, cl.disks[4])
		t.Logf("replace-disk (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
		if !strings.Contains(out, "replaced by "+cl.disks[4]) || lineIndex(out, "pvc-a1 ") < 0 {
			t.Fatalf("replace-disk output lacks the replacement or the rebuilding volume")
		}
		n := cl.node(clusterNode)
		last := n.Status.LastDiskReplacement
		if last == nil || last.Result != v1alpha1.DiskReplacementSucceeded || last.ObservedGeneration != n.Generation ||
			len(last.RebuildingVolumes) != 1 || last.RebuildingVolumes[0] != vol.Name || last.NewDisk == "" {
			t.Fatalf("status.lastDiskReplacement: %+v (generation %d)", last, n.Generation)
		}
		// The pool itself replaced the disk: the new file is Active, the old one Removed.
		for _, d := range cl.pool.Disks() {
			if (d.Path == cl.disks[4] && d.Status != pool.StatusActive) || (d.Path == failed && d.Status != pool.StatusRemoved) {
				t.Fatalf("pool disk after replace-disk: %+v", d)
			}
		}
		// The rebuild, followed with volumes and describe until Healthy.
		var bars []string
		sawDescribeBar := false
		d := cl.waitFor(2*time.Minute, "pvc-a1 Healthy after the rebuild", func() bool {
			out := cl.kubectlOK("volumes", vol.Name)
			if b := barRE.FindString(out); b != "" && (len(bars) == 0 || bars[len(bars)-1] != b) {
				bars = append(bars, b)
			}
			if !sawDescribeBar {
				desc := cl.kubectlOK("describe", "volume", vol.Name)
				if l := lineOf(desc, "  Rebuild:"); l != "" && barRE.MatchString(l) {
					sawDescribeBar = true
					t.Logf("describe during the rebuild:\n%s", desc)
				}
			}
			return cl.volume(vol.Name).Status.Health == v1alpha1.VolumeHealthHealthy
		})
		t.Logf("rebuild to Healthy in %v after replace-disk; bars seen: %q", d.Round(time.Millisecond), bars)
		if len(bars) < 2 || !sawDescribeBar {
			t.Fatalf("rebuild progress not shown: bars %q, in describe %v", bars, sawDescribeBar)
		}
		cl.check(vol.Name, "after the rebuild")
	})

	t.Run("Describe", func(t *testing.T) {
		var out string
		// The Events are written asynchronously by the agent's recorder.
		cl.waitFor(time.Minute, "describe shows the rebuild's Events", func() bool {
			out = cl.kubectlOK("describe", "volume", vol.Name)
			return strings.Contains(out, nodeagent.EventRebuildFinished)
		})
		t.Logf("describe volume:\n%s", out)
		for _, want := range []string{
			"Name:          pvc-a1", "Node:          node-a", "Claim:         apps/data-db-0",
			"  Size:        64MiB (67108864 bytes)", "  Layout:      4 members, 512KiB chunks", "  FS type:     ext4",
			"  Health:      Healthy", "  In sync:     4/4", "  Bad blocks:  0\n",
			"Members:", "Conditions:", "Ready", "Provisioned",
			"Events:", nodeagent.EventProvisioned, nodeagent.EventDegraded, nodeagent.EventRebuildStarted, nodeagent.EventRebuildFinished,
		} {
			if !strings.Contains(out, want) {
				t.Fatalf("describe lacks %q", want)
			}
		}
		if strings.Contains(out, "  Rebuild:") {
			t.Fatal("describe shows a rebuild after it finished")
		}
		newID := cl.node(clusterNode).Status.LastDiskReplacement.NewDisk
		if f := strings.Fields(lineOf(out, "  1 ")); len(f) < 6 || f[1] != newID || f[2] != cl.disks[4] || f[3] != "InSync" || f[4] != "0" || f[5] != "0" {
			t.Fatalf("member 1 (rebuilt onto %s): %q", newID, f)
		}
		// A volume with bad and lost blocks: the counts and each member's.
		bd := cl.kubectlOK("describe", "volume", "b-degraded")
		if !strings.Contains(bd, "  Bad blocks:  7, 2 lost (bad on every copy: reads there fail until rewritten)\n") {
			t.Fatalf("describe b-degraded:\n%s", bd)
		}
		if f := strings.Fields(lineOf(bd, "  0 ")); len(f) < 6 || f[1] != "WWN-B0" || f[2] != "/dev/nvme0n1" || f[4] != "7" || f[5] != "2" {
			t.Fatalf("b-degraded member 0 (7 bad blocks, 2 timeouts): %q", f)
		}
		var dv describedVolume
		if err := json.Unmarshal([]byte(cl.kubectlOK("describe", "volume", vol.Name, "-o", "json")), &dv); err != nil {
			t.Fatal(err)
		}
		if dv.Volume == nil || dv.Volume.Name != vol.Name || len(dv.Volume.Status.Members) != 4 || len(dv.Events) < 4 {
			t.Fatalf("describe -o json: volume %v, %d events", dv.Volume != nil, len(dv.Events))
		}
		for _, e := range dv.Events {
			if e.Regarding.Name != vol.Name || e.Regarding.Kind != "Raid10Volume" {
				t.Fatalf("describe shows an Event about another object: %+v", e.Regarding)
			}
		}
		_, err := cl.kubectl("describe", "volume", "pvc-nope")
		if !errors.Is(err, errNotFound) || !strings.Contains(err.Error(), `unknown volume "pvc-nope"`) {
			t.Fatalf("describe an unknown volume: %v", err)
		}
	})

	// The agent refuses a replacement (the new disk does not exist): the command fails with
	// the agent's reason, the status and an Event say so; the same request again is a new
	// generation that the agent answers again.
	t.Run("ReplaceDiskRefused", func(t *testing.T) {
		second := cl.disks[2]
		secondID := cl.diskID(second)
		if err := cl.pool.FailDisk(second); err != nil {
			t.Fatal(err)
		}
		cl.waitFor(10*time.Second, "second failed disk reported", func() bool { return cl.node(clusterNode).Status.HealthyDisks == 3 })
		missing := filepath.Join(filepath.Dir(second), "no-such-disk.img")
		var gens []int64
		for i := range 2 {
			args := []string{"replace-disk", clusterNode, secondID, missing}
			if i == 1 {
				args = append(args, "-o", "json")
			}
			out, err := cl.kubectl(args...)
			if err == nil || !strings.Contains(err.Error(), "refused the replacement") || !strings.Contains(err.Error(), "no-such-disk.img") {
				t.Fatalf("replace-disk onto a missing disk: %v", err)
			}
			last := cl.node(clusterNode).Status.LastDiskReplacement
			if last.Result != v1alpha1.DiskReplacementFailed || last.OldDisk != secondID {
				t.Fatalf("status.lastDiskReplacement: %+v", last)
			}
			if i == 1 {
				var printed v1alpha1.DiskReplacementStatus
				if err := json.Unmarshal([]byte(out), &printed); err != nil || printed.ObservedGeneration != last.ObservedGeneration || printed.Result != v1alpha1.DiskReplacementFailed {
					t.Fatalf("replace-disk -o json printed %q (%v), status %+v", out, err, last)
				}
			}
			gens = append(gens, last.ObservedGeneration)
		}
		if gens[1] <= gens[0] {
			t.Fatalf("the repeated request was not acted on again: generations %v", gens)
		}
		t.Logf("refused twice: %v", cl.node(clusterNode).Status.LastDiskReplacement.Message)
		// The pool is unchanged by the refusals, and the real replacement still works.
		// With --follow the command returns once the volume is Healthy again, having printed
		// the rebuild's progress.
		start := time.Now()
		out := cl.kubectlOK("replace-disk", clusterNode, secondID, cl.disks[5], "--follow")
		t.Logf("replace-disk --follow (%v):\n%s", time.Since(start).Round(time.Millisecond), out)
		if v := cl.volume(vol.Name); v.Status.Health != v1alpha1.VolumeHealthHealthy {
			t.Fatalf("replace-disk --follow returned with the volume %s", v.Status.Health)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if n := len(barRE.FindAllString(out, -1)); n < 2 || lines[len(lines)-1] != vol.Name+": Healthy, 4/4 members in sync" {
			t.Fatalf("replace-disk --follow: %d progress bars, last line %q", n, lines[len(lines)-1])
		}
		cl.waitFor(time.Minute, "replacement Events on the Raid10Node", func() bool {
			var el eventsv1.EventList
			if err := cl.c.List(ctx, &el); err != nil {
				return false
			}
			seen := map[string]int{}
			for _, e := range el.Items {
				if e.Regarding.Name == clusterNode {
					seen[e.Reason]++
				}
			}
			return seen[nodeagent.EventDiskReplaced] == 2 && seen[nodeagent.EventDiskReplaceFailed] >= 1
		})
		cl.check(vol.Name, "after the refusals and the replacement")
	})

	// --kubeconfig and --context after the command, as kubectl users write them.
	t.Run("KubeconfigAfterCommand", func(t *testing.T) {
		o := *cl.o
		o.Kubeconfig = filepath.Join(t.TempDir(), "missing")
		var out bytes.Buffer
		if err := run(ctx, &o, []string{"volumes", "--kubeconfig", cl.o.Kubeconfig}, &out); err != nil || lineIndex(out.String(), "pvc-a1 ") < 0 {
			t.Fatalf("volumes --kubeconfig: %v\n%s", err, out.String())
		}
		o.Kubeconfig = cl.o.Kubeconfig
		if err := run(ctx, &o, []string{"status", "--context", "no-such-context"}, &out); err == nil || !strings.Contains(err.Error(), "no-such-context") {
			t.Fatalf("status --context no-such-context: %v", err)
		}
	})

	// $KUBECONFIG is read when --kubeconfig is not given.
	t.Run("KubeconfigEnv", func(t *testing.T) {
		t.Setenv("KUBECONFIG", cl.o.Kubeconfig)
		o := *cl.o
		o.Kubeconfig = ""
		var out bytes.Buffer
		if err := run(ctx, &o, []string{"volumes"}, &out); err != nil || lineIndex(out.String(), "pvc-a1 ") < 0 {
			t.Fatalf("with $KUBECONFIG: %v\n%s", err, out.String())
		}
	})
}
