package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestClusterScrub: `kubectl raid10 scrub` against a real API server and node-a's agent:
// one volume with --follow prints progress to Done, --node scrubs every volume of a node,
// --repair asks for a repair; errors name what is wrong.
func TestClusterScrub(t *testing.T) {
	cl := startCluster(t)
	ctx := t.Context()
	for _, name := range []string{"pvc-s1", "pvc-s2"} {
		v := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
			Node: clusterNode, SizeBytes: clusterVol, VolumeMode: v1alpha1.VolumeModeBlock,
			Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
		}}
		v.Name = name
		if err := cl.c.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		cl.waitFor(30*time.Second, name+" Ready", func() bool {
			return cl.volume(name).Status.Phase == v1alpha1.VolumePhaseReady
		})
	}

	// At 16 MiB/s a check of 64 MiB takes about 4 s: progress lines show (the command polls
	// every 500 ms). At the node's rebuildSlow (4 MiB/s) it took 16 s.
	if err := cl.pool.SetVolumeRates("pvc-s1", raid10.Rates{ScrubMax: 16 << 20}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out := cl.kubectlOK("scrub", "pvc-s1", "--follow")
	t.Logf("scrub --follow in %v:\n%s", time.Since(start).Round(time.Second), out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], "pvc-s1: check Running") ||
		!strings.HasPrefix(lines[len(lines)-1], "pvc-s1: check Done 100% (64MiB of 64MiB), 0 mismatches") {
		t.Fatalf("scrub --follow:\n%s", out)
	}
	if sc := cl.volume("pvc-s1").Status.Scrub; sc == nil || sc.State != v1alpha1.ScrubStateDone || sc.LastCompletedTime == nil {
		t.Fatalf("status.scrub: %+v", sc)
	}

	out = cl.kubectlOK("scrub", "--node", clusterNode, "--repair")
	for _, name := range []string{"pvc-s1", "pvc-s2"} {
		if !strings.Contains(out, name+": repair Running") && !strings.Contains(out, name+": repair Done") {
			t.Fatalf("scrub --node --repair lacks %s:\n%s", name, out)
		}
		if rq := cl.volume(name).Spec.Scrub; rq == nil || rq.Kind != v1alpha1.ScrubKindRepair {
			t.Fatalf("%s spec.scrub: %+v", name, rq)
		}
	}
	if out := cl.kubectlOK("describe", "volume", "pvc-s1"); !strings.Contains(out, "Scrub:       repair") || !strings.Contains(out, "last completed") {
		t.Fatalf("describe volume lacks the scrub:\n%s", out)
	}
	out = cl.kubectlOK("volumes", "pvc-s2", "-o", "json")
	if !strings.Contains(out, `"scrub"`) {
		t.Fatalf("volumes -o json has no scrub:\n%s", out)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
		err  error
	}{
		{"Usage", []string{"scrub"}, "usage: scrub VOLUME|--node NODE", nil},
		{"Both", []string{"scrub", "pvc-s1", "--node", clusterNode}, "usage", nil},
		{"UnknownVolume", []string{"scrub", "nope"}, `unknown volume "nope"`, errNotFound},
		{"UnknownNode", []string{"scrub", "--node", "node-z"}, `unknown node "node-z"`, errNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := cl.kubectl(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.err != nil && !errors.Is(err, tc.err)) {
				t.Fatalf("%v: %v\n%s", tc.args, err, out)
			}
		})
	}
}
