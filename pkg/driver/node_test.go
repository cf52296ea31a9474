package driver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	testingexec "k8s.io/utils/exec/testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
)

// fakeAttacher is a stateful VolumeAttacher: volumes it knows attach to /dev/fakeN.
type fakeAttacher struct {
	mu       sync.Mutex
	vols     map[string]attach.VolumeState
	attached map[string]string
}

var _ VolumeAttacher = (*fakeAttacher)(nil)

func newFakeAttacher(ids ...string) *fakeAttacher {
	f := &fakeAttacher{vols: map[string]attach.VolumeState{}, attached: map[string]string{}}
	for _, id := range ids {
		f.vols[id] = attach.VolumeState{SizeBytes: 1 << 30}
	}
	return f
}

func (f *fakeAttacher) Attach(_ context.Context, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.vols[id]; !ok {
		return "", fmt.Errorf("volume %q: %w", id, ErrNotFound)
	}
	if d, ok := f.attached[id]; ok {
		return d, nil
	}
	d := fmt.Sprintf("/dev/fake%d", len(f.attached))
	f.attached[id] = d
	return d, nil
}

func (f *fakeAttacher) Device(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attached[id]
}

func (f *fakeAttacher) Detach(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.attached, id)
	return nil
}

// Expand reports the volume's size as the device's; a volume not attached is
// ErrFailedPrecondition, as PoolAttacher's.
func (f *fakeAttacher) Expand(_ context.Context, id string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.attached[id]; !ok {
		return 0, fmt.Errorf("volume %q is not attached: %w", id, ErrFailedPrecondition)
	}
	return f.vols[id].SizeBytes, nil
}

func (f *fakeAttacher) Volume(_ context.Context, id string) (attach.VolumeState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vols[id]
	if !ok {
		return v, fmt.Errorf("volume %q: %w", id, ErrNotFound)
	}
	return v, nil
}

// fakeExec answers blkid with "blank" (exit 2) until mkfs ran on the device, then with the
// filesystem made, and blockdev --getro with 0; every other command succeeds. It records the
// commands.
type fakeExec struct {
	testingexec.FakeExec
	mu    sync.Mutex
	fs    map[string]string // device -> filesystem made
	calls []string
}

func (e *fakeExec) Command(cmd string, args ...string) utilexec.Cmd {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, cmd)
	dev := ""
	if len(args) > 0 {
		dev = args[len(args)-1]
	}
	out, err := []byte{}, error(nil)
	switch cmd {
	case "blkid":
		if fs, ok := e.fs[dev]; ok {
			out = []byte("DEVNAME=" + dev + "\nTYPE=" + fs + "\n")
		} else {
			err = &testingexec.FakeExitError{Status: 2}
		}
	case "mkfs.ext4", "mkfs.xfs":
		e.fs[dev] = cmd[len("mkfs."):]
	case "blockdev": // --getro, before a stage grows an existing filesystem: writable
		out = []byte("0\n")
	}
	return &testingexec.FakeCmd{CombinedOutputScript: []testingexec.FakeAction{
		func() ([]byte, []byte, error) { return out, nil, err },
	}}
}

func (e *fakeExec) ran(cmd string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.calls {
		if c == cmd {
			n++
		}
	}
	return n
}

// mounterTable is the MountTable of a FakeMounter: the mounts whose device is dev (the
// FakeMounter, like the kernel, shows a bind of a mount point with its device).
type mounterTable struct{ m mount.Interface }

var _ MountTable = mounterTable{}

func (mt mounterTable) MountsOf(dev string) ([]string, error) {
	mps, err := mt.m.List()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, mp := range mps {
		if mp.Device == dev {
			out = append(out, mp.Path)
		}
	}
	return out, nil
}

func newTestNode(t *testing.T) (*NodeServer, *fakeAttacher, *mount.FakeMounter, *fakeExec) {
	t.Helper()
	att := newFakeAttacher("vol-1", "vol-2")
	m := mount.NewFakeMounter(nil)
	ex := &fakeExec{fs: map[string]string{}}
	n, err := NewNodeServer(NodeConfig{NodeID: "node-a", Attacher: att, Mounter: m, Exec: ex, Mounts: mounterTable{m}})
	if err != nil {
		t.Fatal(err)
	}
	return n, att, m, ex
}

func TestNodeStageValidation(t *testing.T) {
	n, _, _, _ := newTestNode(t)
	dir := t.TempDir()
	multi := mountCap("ext4")
	multi.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	for _, tc := range []struct {
		name string
		req  *csi.NodeStageVolumeRequest
		want codes.Code
	}{
		{"no volume id", &csi.NodeStageVolumeRequest{StagingTargetPath: dir, VolumeCapability: mountCap("")}, codes.InvalidArgument},
		{"no staging path", &csi.NodeStageVolumeRequest{VolumeId: "vol-1", VolumeCapability: mountCap("")}, codes.InvalidArgument},
		{"no capability", &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: dir}, codes.InvalidArgument},
		{"bad fs type", &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: dir, VolumeCapability: mountCap("btrfs")}, codes.InvalidArgument},
		{"multi-node access", &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: dir, VolumeCapability: multi}, codes.InvalidArgument},
		{"unknown volume", &csi.NodeStageVolumeRequest{VolumeId: "nope", StagingTargetPath: dir, VolumeCapability: mountCap("")}, codes.NotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.NodeStageVolume(context.Background(), tc.req)
			if got := status.Code(toStatus(err)); got != tc.want {
				t.Fatalf("code %s, want %s: %v", got, tc.want, err)
			}
		})
	}
}

func TestNodeOtherValidation(t *testing.T) {
	n, _, _, _ := newTestNode(t)
	dir := t.TempDir()
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
	}{
		{"publish without target", func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: dir, VolumeCapability: mountCap("")})
			return err
		}, codes.InvalidArgument},
		{"publish without staging", func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", TargetPath: dir, VolumeCapability: mountCap("")})
			return err
		}, codes.InvalidArgument},
		{"publish not staged", func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: filepath.Join(dir, "none"), TargetPath: filepath.Join(dir, "t"), VolumeCapability: mountCap("")})
			return err
		}, codes.FailedPrecondition},
		{"unpublish without volume id", func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: dir})
			return err
		}, codes.InvalidArgument},
		{"unpublish missing target is success", func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: filepath.Join(dir, "gone")})
			return err
		}, codes.OK},
		{"unstage without staging path", func() error {
			_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1"})
			return err
		}, codes.InvalidArgument},
		{"unstage never staged is success", func() error {
			_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-2", StagingTargetPath: filepath.Join(dir, "gone")})
			return err
		}, codes.OK},
		{"stats without path", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1"})
			return err
		}, codes.InvalidArgument},
		{"stats unknown volume", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "nope", VolumePath: dir})
			return err
		}, codes.NotFound},
		{"stats missing path", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: filepath.Join(dir, "gone")})
			return err
		}, codes.NotFound},
		{"expand without path", func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-1"})
			return err
		}, codes.InvalidArgument},
		{"expand unknown volume", func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "nope", VolumePath: dir})
			return err
		}, codes.NotFound},
		{"expand not staged", func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: dir, VolumeCapability: blockCap()})
			return err
		}, codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(toStatus(tc.call())); got != tc.want {
				t.Fatalf("code %s, want %s", got, tc.want)
			}
		})
	}
}

// TestNodeRequiredFieldsNamed: every node RPC names the first missing field, in the order
// the CSI spec lists them.
func TestNodeRequiredFieldsNamed(t *testing.T) {
	n, _, _, _ := newTestNode(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, field string
		call        func() error
	}{
		{"stage", "volume_id", func() error {
			_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{StagingTargetPath: "/x"})
			return err
		}},
		{"stage", "staging_target_path", func() error {
			_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1"})
			return err
		}},
		{"unstage", "staging_target_path", func() error {
			_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1"})
			return err
		}},
		{"publish", "staging_target_path", func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", TargetPath: "/t"})
			return err
		}},
		{"publish", "target_path", func() error {
			_, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: "/s"})
			return err
		}},
		{"unpublish", "volume_id", func() error {
			_, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{TargetPath: "/t"})
			return err
		}},
		{"stats", "volume_path", func() error {
			_, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1"})
			return err
		}},
		{"expand", "volume_id", func() error {
			_, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumePath: "/p"})
			return err
		}},
	} {
		t.Run(tc.name+" "+tc.field, func(t *testing.T) {
			err := toStatus(tc.call())
			if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), tc.field+": ") {
				t.Fatalf("%v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
}

// TestNodeExpandFake: a staged block volume reports the device's size after the attacher
// grew it; a required size the device does not have yet is retryable, not a success.
func TestNodeExpandFake(t *testing.T) {
	n, att, _, _ := newTestNode(t)
	ctx := context.Background()
	dir := t.TempDir()
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: dir, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	expand := func(required int64) (int64, error) {
		r, err := n.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: dir,
			VolumeCapability: blockCap(), CapacityRange: &csi.CapacityRange{RequiredBytes: required}})
		return r.GetCapacityBytes(), toStatus(err)
	}
	if got, err := expand(1 << 30); err != nil || got != 1<<30 {
		t.Fatalf("expand at the same size: %d %v", got, err)
	}
	att.mu.Lock()
	att.vols["vol-1"] = attach.VolumeState{SizeBytes: 3 << 30}
	att.mu.Unlock()
	if got, err := expand(3 << 30); err != nil || got != 3<<30 {
		t.Fatalf("expand after the pool grew: %d %v, want %d", got, err, int64(3<<30))
	}
	if _, err := expand(4 << 30); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "not grown the array yet") {
		t.Fatalf("expand beyond the device: %v, want DeadlineExceeded saying the array has not grown", err)
	}
}

// TestNodeLifecycleFake drives stage, publish, stats, unpublish and unstage through the
// FakeMounter: mkfs runs once, on the blank device only, and every step is idempotent.
func TestNodeLifecycleFake(t *testing.T) {
	n, att, m, ex := newTestNode(t)
	ctx := context.Background()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	stage := &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, VolumeCapability: mountCap("xfs")}
	for i := 0; i < 2; i++ {
		if _, err := n.NodeStageVolume(ctx, stage); err != nil {
			t.Fatalf("stage %d: %v", i, err)
		}
	}
	if got := ex.ran("mkfs.xfs"); got != 1 {
		t.Fatalf("mkfs.xfs ran %d times, want 1", got)
	}
	if notMnt, _ := m.IsLikelyNotMountPoint(staging); notMnt {
		t.Fatal("staging path not mounted")
	}
	// An xfs device asked for as ext4 is refused, never reformatted.
	other := filepath.Join(dir, "other")
	_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: other, VolumeCapability: mountCap("ext4")})
	if status.Code(toStatus(err)) != codes.FailedPrecondition || ex.ran("mkfs.ext4") != 0 {
		t.Fatalf("mismatched fs: %v, mkfs.ext4 ran %d", err, ex.ran("mkfs.ext4"))
	}

	// No type asked for: the xfs the volume holds is mounted as it is.
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: other, VolumeCapability: mountCap("")}); err != nil {
		t.Fatalf("stage without fs type: %v", err)
	}
	if mps, _ := m.List(); mps[len(mps)-1].Type != "xfs" || ex.ran("mkfs.xfs") != 1 {
		t.Fatalf("mounted %+v, mkfs.xfs ran %d times", mps[len(mps)-1], ex.ran("mkfs.xfs"))
	}
	// The filesystem the volume already had is grown to its device (a restore into a larger
	// claim); the one just made is not.
	if n := ex.ran("xfs_growfs"); n != 1 {
		t.Fatalf("xfs_growfs ran %d times, want once: at the stage of the existing filesystem only", n)
	}
	// Undo that second staging of the same device without detaching it.
	if err := m.Unmount(other); err != nil {
		t.Fatal(err)
	}

	pub := &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap("xfs"), Readonly: true}
	for i := 0; i < 2; i++ {
		if _, err := n.NodePublishVolume(ctx, pub); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	mps, _ := m.List()
	var bind *mount.MountPoint
	for i := range mps {
		if mps[i].Path == target {
			bind = &mps[i]
		}
	}
	// The FakeMounter, like the kernel, shows a bind of a mount point with its device.
	if bind == nil || bind.Device != att.attached["vol-1"] || len(mps) != 2 {
		t.Fatalf("no single bind of %s onto %s: %+v", staging, target, mps)
	}
	if !contains(bind.Opts, "ro") || !contains(bind.Opts, "bind") {
		t.Fatalf("bind options %v, want bind and ro", bind.Opts)
	}

	att.mu.Lock()
	att.vols["vol-1"] = attach.VolumeState{SizeBytes: 1 << 30, Abnormal: true, Message: "volume is Degraded"}
	att.mu.Unlock()
	st, err := n.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "vol-1", VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.GetUsage()) != 2 {
		t.Fatalf("stats %v", st)
	}

	// Unstage while published is refused: detaching would fail the pod's I/O.
	_, err = n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging})
	if status.Code(toStatus(err)) != codes.FailedPrecondition {
		t.Fatalf("unstage while published: %v, want FailedPrecondition", err)
	}

	for i := 0; i < 2; i++ {
		if _, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}); err != nil {
			t.Fatalf("unpublish %d: %v", i, err)
		}
		if _, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging}); err != nil {
			t.Fatalf("unstage %d: %v", i, err)
		}
	}
	if mps, _ := m.List(); len(mps) != 0 {
		t.Fatalf("mounts left: %+v", mps)
	}
	if len(att.attached) != 0 {
		t.Fatalf("still attached: %v", att.attached)
	}
}

func TestNodeBlockPublishFake(t *testing.T) {
	n, att, m, _ := newTestNode(t)
	ctx := context.Background()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pods", "dev")
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-2", StagingTargetPath: staging, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-2", StagingTargetPath: staging, TargetPath: target, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	mps, _ := m.List()
	if len(mps) != 1 || mps[0].Device != att.attached["vol-2"] || mps[0].Path != target {
		t.Fatalf("mounts %+v, want the device bound onto %s", mps, target)
	}
}

func TestNodeLockAborted(t *testing.T) {
	n, _, _, _ := newTestNode(t)
	if err := n.locks.TryAcquire("vol-1"); err != nil {
		t.Fatal(err)
	}
	defer n.locks.Release("vol-1")
	_, err := n.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: t.TempDir(), VolumeCapability: mountCap("")})
	if got := status.Code(toStatus(err)); got != codes.Aborted {
		t.Fatalf("code %s, want Aborted", got)
	}
}

func TestNodeInfoAndCapabilities(t *testing.T) {
	n, _, _, _ := newTestNode(t)
	info, err := n.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetNodeId() != "node-a" || info.GetMaxVolumesPerNode() != DefaultMaxVolumesPerNode ||
		info.GetAccessibleTopology().GetSegments()["raid10.csi.io/node"] != "node-a" {
		t.Fatalf("info %v", info)
	}
	caps, err := n.NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caps.GetCapabilities()) != 3 {
		t.Fatalf("capabilities %v", caps)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestNodeModeDriver serves the node service through NewDriver in ModeNode, over a unix socket.
func TestNodeModeDriver(t *testing.T) {
	n, _, _, _ := newTestNode(t)
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := NewDriver(WithMode(ModeNode), WithEndpoint("unix://"+sock), WithNodeID("node-a"), WithNodeService(n))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := csi.NewNodeClient(conn)
	var info *csi.NodeGetInfoResponse
	for i := 0; ; i++ {
		if info, err = c.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || info.GetNodeId() != "node-a" {
		t.Fatalf("NodeGetInfo: %v %v", info, err)
	}
	// Errors go through the interceptor: a missing field is InvalidArgument.
	_, err = c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1"})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "staging_target_path") {
		t.Fatalf("stage without staging path: %v", err)
	}
}

// TestNodeUnstageStagingUnmounted: the staging path was unmounted behind the driver's back
// while a pod's bind of it lives on. Unstage must look the device up in the mount table and
// refuse, naming the bind, rather than take the unmounted staging path for "nothing uses
// it" and detach the device under the pod.
func TestNodeUnstageStagingUnmounted(t *testing.T) {
	n, att, m, _ := newTestNode(t)
	ctx := context.Background()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pod", "mount")
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, VolumeCapability: mountCap("ext4")}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap("ext4")}); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(staging); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging})
		if status.Code(toStatus(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), target) {
			t.Fatalf("unstage %d with the staging path unmounted and %s bound: %v, want FailedPrecondition naming it", i, target, err)
		}
		if att.Device("vol-1") == "" {
			t.Fatal("the device was detached under the publish bind")
		}
	}
	if _, err := n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage after unpublish: %v", err)
	}
	if att.Device("vol-1") != "" {
		t.Fatal("still attached after unstage")
	}
}

// TestNodeUnstageBlockPublished: a published Block volume (its device node bound onto a
// file) is not unstaged either.
func TestNodeUnstageBlockPublished(t *testing.T) {
	n, att, _, _ := newTestNode(t)
	ctx := context.Background()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pods", "dev")
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-2", StagingTargetPath: staging, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-2", StagingTargetPath: staging, TargetPath: target, VolumeCapability: blockCap()}); err != nil {
		t.Fatal(err)
	}
	_, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-2", StagingTargetPath: staging})
	if status.Code(toStatus(err)) != codes.FailedPrecondition || att.Device("vol-2") == "" {
		t.Fatalf("unstage of a published block volume: %v (device %q), want FailedPrecondition and still attached", err, att.Device("vol-2"))
	}
}

// TestMountInfoMountsOf reads a mountinfo file against a real block device node (made with
// mknod, nothing mounted): a filesystem on the device matches by major:minor whatever its
// source column says, a bind of the node itself matches through the mount point's stat,
// other devices and a device that does not exist match nothing, and a non-device is refused.
func TestMountInfoMountsOf(t *testing.T) {
	testenv.RequireRoot(t, "mknod of a block device node")
	dir := t.TempDir()
	dev, bind := filepath.Join(dir, "nbd7"), filepath.Join(dir, "pod-dev")
	for _, p := range []string{dev, bind} {
		if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(43, 7))); err != nil {
			t.Fatal(err)
		}
	}
	info := filepath.Join(dir, "mountinfo")
	table := strings.Join([]string{
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
		"40 22 43:7 / /var/lib/kubelet/staging rw shared:2 - ext4 /dev/nbd7 rw",
		"41 22 43:7 / /var/lib/kubelet/pods/p/mount rw shared:2 - ext4 /dev/disk/by-id/other-name rw",
		"42 22 43:8 / /var/lib/kubelet/other rw shared:3 - ext4 /dev/nbd8 rw",
		"43 22 0:5 /nbd7 " + bind + " rw shared:4 - devtmpfs udev rw",
		"44 22 0:5 / /dev rw shared:5 - devtmpfs udev rw",
	}, "\n") + "\n"
	if err := os.WriteFile(info, []byte(table), 0o600); err != nil {
		t.Fatal(err)
	}
	mt := MountInfo{Path: info}
	got, err := mt.MountsOf(dev)
	want := []string{"/var/lib/kubelet/staging", "/var/lib/kubelet/pods/p/mount", bind}
	if err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("MountsOf(%s) = %v, %v; want %v", dev, got, err, want)
	}
	if got, err := mt.MountsOf(filepath.Join(dir, "gone")); err != nil || len(got) != 0 {
		t.Fatalf("MountsOf(a missing device) = %v, %v; want none", got, err)
	}
	if _, err := mt.MountsOf(info); status.Code(toStatus(err)) != codes.InvalidArgument {
		t.Fatalf("MountsOf(a regular file): %v, want InvalidArgument", err)
	}
}

// TestStageMountOptions: an xfs staging mount always gets nouuid (a clone or a restore has
// its source's UUID, which the kernel refuses to mount twice), once; other filesystems keep
// the claim's flags as they are.
func TestStageMountOptions(t *testing.T) {
	for _, tc := range []struct {
		fs    string
		flags []string
		want  []string
	}{
		{"xfs", nil, []string{"nouuid"}},
		{"xfs", []string{"noatime"}, []string{"noatime", "nouuid"}},
		{"xfs", []string{"nouuid"}, []string{"nouuid"}},
		{"ext4", []string{"noatime"}, []string{"noatime"}},
		{"ext4", nil, nil},
	} {
		flags := slices.Clone(tc.flags)
		if got := stageMountOptions(tc.fs, flags); !slices.Equal(got, tc.want) {
			t.Errorf("stageMountOptions(%s, %v) = %v, want %v", tc.fs, tc.flags, got, tc.want)
		}
		if !slices.Equal(flags, tc.flags) {
			t.Errorf("stageMountOptions(%s) changed the claim's flags to %v", tc.fs, flags)
		}
	}
}
