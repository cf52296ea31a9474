package agent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// TestAgentLimitsRealAPIServer: a Raid10Volume's spec.limits reach the engine (the array's
// limits in force) and show in status.limits; a change of spec.limits is applied live; after
// a restart of the agent with a pool opened afresh (the pool keeps limits in memory only) the
// agent puts them on again, although status.limits already shows them.
func TestAgentLimitsRealAPIServer(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()
	dir := t.TempDir()
	pcfg := fileDisks(t, dir, 4)
	// start opens the pool and runs the agent over it; stop undoes both.
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
	// Bursts set explicitly: the array reports its limits with the bursts in force.
	first := v1alpha1.VolumeLimits{ReadIOPS: 500, ReadIOPSBurst: 50, WriteBytesPerSecond: 8 << 20, WriteBytesBurst: 1 << 20}
	second := v1alpha1.VolumeLimits{WriteIOPS: 100, WriteIOPSBurst: 10, WriteBytesPerSecond: 8 << 20, WriteBytesBurst: 1 << 20}
	engine := func(l v1alpha1.VolumeLimits) raid10.Limits {
		return raid10.Limits{ReadIOPS: l.ReadIOPS, ReadIOPSBurst: l.ReadIOPSBurst, WriteIOPS: l.WriteIOPS, WriteIOPSBurst: l.WriteIOPSBurst,
			ReadBytesPerSecond: l.ReadBytesPerSecond, ReadBytesBurst: l.ReadBytesBurst, WriteBytesPerSecond: l.WriteBytesPerSecond, WriteBytesBurst: l.WriteBytesBurst}
	}
	// applied waits until the array has want in force and the status reports it.
	applied := func(pl *pool.Pool, name string, want v1alpha1.VolumeLimits) time.Duration {
		t.Helper()
		return waitFor(t, 30*time.Second, fmt.Sprintf("limits %+v on the array and in status", want), func() bool {
			a, err := pl.Array(name)
			if err != nil || a.Status().Limits != engine(want) {
				return false
			}
			st := getVolume(t, c, name).Status
			return st.Limits != nil && *st.Limits == want
		})
	}

	pl, stop := start()
	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 64 << 10}, Limits: first.DeepCopy(),
	}}
	vol.Name = "pvc-limited"
	vol.Finalizers = []string{v1alpha1.VolumeFinalizer}
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Logf("created with limits: applied after %v", applied(pl, vol.Name, first).Round(time.Millisecond))

	v := getVolume(t, c, vol.Name)
	v.Spec.Limits = second.DeepCopy()
	if err := c.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	t.Logf("changed live: applied after %v", applied(pl, vol.Name, second).Round(time.Millisecond))
	stop()

	pl, stop = start()
	defer stop()
	t.Logf("after a restart: applied again after %v", applied(pl, vol.Name, second).Round(time.Millisecond))

	// Lifting them all: spec.limits absent, nothing in force, nothing in status.
	v = getVolume(t, c, vol.Name)
	v.Spec.Limits = nil
	if err := c.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "limits lifted", func() bool {
		a, err := pl.Array(vol.Name)
		return err == nil && a.Status().Limits == raid10.Limits{} && getVolume(t, c, vol.Name).Status.Limits == nil
	})
	if err := c.Delete(ctx, getVolume(t, c, vol.Name)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "volume deleted", func() bool {
		var l v1alpha1.Raid10VolumeList
		return c.List(ctx, &l) == nil && len(l.Items) == 0
	})
}
