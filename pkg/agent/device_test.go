package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// fakeDevices is a stateful agent.Devices: a test attaches and detaches volumes, and Expand
// records the device size it would set (the pool's volume size, as PoolAttacher's kernel
// resize does).
type fakeDevices struct {
	pool *pool.Pool

	mu      sync.Mutex
	devs    map[string]string
	sizes   map[string]int64 // device size after the last Expand
	expands int
}

var _ agent.Devices = (*fakeDevices)(nil)

func (f *fakeDevices) Device(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devs[id]
}

func (f *fakeDevices) Expand(_ context.Context, id string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.devs[id] == "" {
		return 0, fmt.Errorf("volume %q not attached", id)
	}
	vi, err := f.pool.Volume(id)
	if err != nil {
		return 0, err
	}
	if f.sizes[id] != int64(vi.Size) {
		f.expands++
	}
	f.sizes[id] = int64(vi.Size)
	return f.sizes[id], nil
}

// Frontend describes the volume's device as attach.PoolAttacher does on a kernel with
// UPDATE_SIZE: the agent reports it as status.frontend.
func (f *fakeDevices) Frontend(id string) string {
	switch dev := f.Device(id); {
	case strings.HasPrefix(dev, "/dev/ublkb"):
		return "ublk (UPDATE_SIZE)"
	case dev != "":
		return "nbd"
	}
	return ""
}

func (f *fakeDevices) set(id, dev string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.devs[id] = dev
}

func (f *fakeDevices) size(id string) (int64, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sizes[id], f.expands
}

// TestAgentDevicesAndChunkSize runs the agent against a real kube-apiserver with a Devices
// source: the volume is created with the spec's chunk size (the array says so), the device
// the attacher reports appears as status.devicePath and goes when it detaches, and a growth
// of the array grows the attached device as well.
func TestAgentDevicesAndChunkSize(t *testing.T) {
	c, cfg := startAPI(t)
	ctx := t.Context()
	dir := t.TempDir()
	pcfg := fileDisks(t, dir, 4)
	pl, err := pool.Open(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	devs := &fakeDevices{pool: pl, devs: map[string]string{}, sizes: map[string]int64{}}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(actx, cfg, agent.Options{NodeName: nodeName, Pool: pl, Devices: devs}) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent.Run: %v", err)
		}
	}()

	vol := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: nodeName, SizeBytes: volumeSize, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 64 << 10},
	}}
	vol.Name = "pvc-chunk64"
	vol.Finalizers = []string{v1alpha1.VolumeFinalizer}
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "volume Ready", func() bool {
		v := getVolume(t, c, vol.Name)
		return v.Status.Phase == v1alpha1.VolumePhaseReady && v.Status.ObservedGeneration == v.Generation
	})
	vi, err := pl.Volume(vol.Name)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := pl.Array(vol.Name); err != nil || vi.ChunkSize != 64<<10 || a.ChunkSize() != 64<<10 {
		t.Fatalf("chunk size: pool %d, array %v (%v); want %d", vi.ChunkSize, a, err, 64<<10)
	}
	if got := getVolume(t, c, vol.Name).Status.DevicePath; got != "" {
		t.Fatalf("devicePath %q before any attach", got)
	}

	devs.set(vol.Name, "/dev/nbd7")
	d := waitFor(t, 10*time.Second, "devicePath reported", func() bool {
		st := getVolume(t, c, vol.Name).Status
		return st.DevicePath == "/dev/nbd7" && st.Frontend == "nbd"
	})
	t.Logf("devicePath reported %v after the attach", d.Round(time.Millisecond))

	// Growing: the spec asks for more, the agent grows the array, then the device.
	v := getVolume(t, c, vol.Name)
	v.Spec.SizeBytes = 2 * volumeSize
	if err := c.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	d = waitFor(t, 30*time.Second, "device grown with the array", func() bool {
		n, _ := devs.size(vol.Name)
		return n == 2*volumeSize
	})
	got := getVolume(t, c, vol.Name)
	if _, expands := devs.size(vol.Name); expands != 2 { // to 64 MiB at the attach, to 128 MiB now
		t.Fatalf("device resized %d times, want 2", expands)
	}
	t.Logf("device grown %v after the spec changed; status capacity %s, phase %s", d.Round(time.Millisecond), got.Status.Capacity, got.Status.Phase)

	// Served over ublk instead: status.frontend carries the attacher's description.
	devs.set(vol.Name, "/dev/ublkb3")
	waitFor(t, 10*time.Second, "ublk frontend with its features reported", func() bool {
		st := getVolume(t, c, vol.Name).Status
		return st.DevicePath == "/dev/ublkb3" && st.Frontend == "ublk (UPDATE_SIZE)"
	})

	// Deleting the object while the volume is attached (staged) must not touch the data:
	// the delete waits for the detach.
	if err := c.Delete(ctx, getVolume(t, c, vol.Name)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // three polls of the agent
	if _, err := pl.Volume(vol.Name); err != nil {
		t.Fatalf("the attached volume was deleted from the pool: %v", err)
	}
	if v := getVolume(t, c, vol.Name); v.DeletionTimestamp == nil || len(v.Finalizers) == 0 {
		t.Fatalf("object %+v: want it held by its finalizer while attached", v.ObjectMeta)
	}

	devs.set(vol.Name, "")
	d = waitFor(t, 30*time.Second, "volume deleted after the detach", func() bool {
		_, err := pl.Volume(vol.Name)
		return errors.Is(err, pool.ErrNotFound)
	})
	t.Logf("deleted %v after the detach", d.Round(time.Millisecond))
}
