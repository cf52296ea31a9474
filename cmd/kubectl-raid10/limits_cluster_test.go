package main

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// TestClusterLimits: the QoS limits in volumes and describe volume, against a real
// kube-apiserver with the chart's CRDs and the real node agent over a pool of file disks. A
// volume's spec.limits, once the agent has put them on the array (the engine's own Limits
// say so), show as the LIMITS column and describe's Spec and Status lines; changed live (as
// ControllerModifyVolume changes them) they show the new values once applied; a volume whose
// node runs no agent shows its limits as pending.
func TestClusterLimits(t *testing.T) {
	cl := startCluster(t)
	ctx := t.Context()

	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: clusterNode, SizeBytes: clusterVol, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
		Limits: &v1alpha1.VolumeLimits{WriteIOPS: 500, ReadBytesPerSecond: 100 << 20, ReadBytesBurst: 8 << 20},
	}}
	vol.Name = "pvc-q"
	if err := cl.c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	applied := func(want v1alpha1.VolumeLimits) {
		t.Helper()
		cl.waitFor(30*time.Second, "pvc-q's limits applied", func() bool {
			v := cl.volume(vol.Name)
			return v.Status.Limits != nil && *v.Status.Limits == want && equality.Semantic.DeepEqual(v.Spec.Limits, v.Status.Limits)
		})
		arr, err := cl.pool.Array(vol.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := arr.Limits(); got.WriteIOPS != want.WriteIOPS || got.ReadBytesPerSecond != want.ReadBytesPerSecond {
			t.Fatalf("engine limits %+v, want those of %+v", got, want)
		}
	}
	applied(*vol.Spec.Limits)

	// node-b runs no agent: its volume's limits stay pending.
	pend := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: "node-b", SizeBytes: 1 << 30, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 2, ChunkSizeBytes: 512 << 10},
		Limits: &v1alpha1.VolumeLimits{ReadIOPS: 2000, WriteBytesPerSecond: 50 << 20},
	}}
	pend.Name = "pvc-pending"
	if err := cl.c.Create(ctx, pend); err != nil {
		t.Fatal(err)
	}
	plain := &v1alpha1.Raid10Volume{Spec: pend.Spec}
	plain.Name, plain.Spec.Limits = "pvc-plain", nil
	if err := cl.c.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}

	out := cl.kubectlOK("volumes")
	t.Logf("volumes:\n%s", out)
	for _, c := range []struct{ row, want string }{
		{"pvc-q ", " r:100MiB/s,w:500iops "},
		{"pvc-pending ", " r:2000iops,w:50MiB/s (pending) "},
		{"pvc-plain ", " - "},
	} {
		if l := lineOf(out, c.row); !strings.Contains(l, c.want) {
			t.Errorf("volumes: row %q lacks %q", l, c.want)
		}
	}
	if l := lineOf(out, "pvc-q "); strings.Contains(l, "pending") {
		t.Errorf("volumes: applied limits shown pending: %q", l)
	}

	out = cl.kubectlOK("describe", "volume", vol.Name)
	t.Logf("describe:\n%s", out)
	for _, want := range []string{
		"  QoS limits:  read 100MiB per second (burst 8MiB); write 500 IOPS\n",
		"  QoS limits:  applied\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe %s lacks %q", vol.Name, want)
		}
	}
	out = cl.kubectlOK("describe", "volume", pend.Name)
	for _, want := range []string{
		"  QoS limits:  read 2000 IOPS; write 50MiB per second\n",
		"  QoS limits:  none (spec not applied yet",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("describe %s lacks %q:\n%s", pend.Name, want, out)
		}
	}
	if out := cl.kubectlOK("describe", "volume", plain.Name); !strings.Contains(out, "  QoS limits:  none\n") ||
		!strings.Contains(out, "  QoS limits:  applied\n") {
		t.Errorf("describe %s (no limits):\n%s", plain.Name, out)
	}

	// Changed live, as ControllerModifyVolume does: the new limits once the agent applied them.
	v := cl.volume(vol.Name)
	v.Spec.Limits = &v1alpha1.VolumeLimits{WriteIOPS: 1000, WriteIOPSBurst: 10, ReadBytesPerSecond: 1 << 30}
	if err := cl.c.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	applied(*v.Spec.Limits)
	if l := lineOf(cl.kubectlOK("volumes", vol.Name), "pvc-q "); !strings.Contains(l, " r:1GiB/s,w:1000iops ") {
		t.Errorf("volumes after the change: %q", l)
	}
	if out := cl.kubectlOK("describe", "volume", vol.Name); !strings.Contains(out, "write 1000 IOPS (burst 10)\n") {
		t.Errorf("describe after the change:\n%s", out)
	}
}
