package driver

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	mount "k8s.io/mount-utils"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/crstatus"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

const localNode = "standalone-1"

// startAllMode serves a --mode=all driver over a unix socket: the controller over a
// LocalStore on p (records in dir), the node service over the fake attacher (the real one
// is exercised in the VM by test/sanity).
func startAllMode(t *testing.T, s *LocalStore) (csi.ControllerClient, csi.IdentityClient, csi.NodeClient) {
	t.Helper()
	ns, err := NewNodeServer(NodeConfig{NodeID: localNode, Attacher: newFakeAttacher(), Mounter: mount.NewFakeMounter(nil), Exec: &fakeExec{fs: map[string]string{}},
		Pool: s.pool})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := NewDriver(WithMode(ModeAll), WithEndpoint("unix://"+sock), WithVolumeStore(s), WithNodeService(ns),
		WithNodeID(localNode), WithReadyTimeout(5*time.Second), WithPollInterval(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver Run: %v", err)
		}
	})
	var conn *grpc.ClientConn
	waitFor(t, func() bool {
		if _, err := os.Stat(sock); err != nil {
			return false
		}
		conn, err = grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}))
		return err == nil
	})
	t.Cleanup(func() { _ = conn.Close() })
	return csi.NewControllerClient(conn), csi.NewIdentityClient(conn), csi.NewNodeClient(conn)
}

// reopenPool closes p and opens the pool of cfg again, as a restart of the plugin does;
// the new pool closes with the test.
func reopenPool(t *testing.T, p *pool.Pool, cfg pool.Config) *pool.Pool {
	t.Helper()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p2, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p2.Close() })
	return p2
}

func openLocalStore(t *testing.T, p *pool.Pool, path string) *LocalStore {
	t.Helper()
	s, err := NewLocalStore(p, localNode, path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLocalStoreController runs the controller service of --mode=all over a pool of four real
// file disks: create (idempotent, AlreadyExists, ResourceExhausted), capacity, expand, list,
// delete, each checked against the pool itself.
func TestLocalStoreController(t *testing.T) {
	p, _ := openFilePool(t, 256<<20)
	s := openLocalStore(t, p, filepath.Join(t.TempDir(), LocalRecordsFile))
	cc, ic, nc := startAllMode(t, s)
	ctx := context.Background()

	caps, err := ic.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil || !strings.Contains(caps.String(), "CONTROLLER_SERVICE") {
		t.Fatalf("GetPluginCapabilities: %v, %v: want the controller service", caps, err)
	}
	info, err := nc.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatalf("NodeGetInfo: %v", err)
	}

	capBefore, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: info.GetAccessibleTopology()})
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(p.Capacity().LargestVolume); capBefore.GetAvailableCapacity() != want || want < 400<<20 {
		t.Fatalf("GetCapacity = %d, want the pool's largest volume %d (about 500 MiB)", capBefore.GetAvailableCapacity(), want)
	}

	// Without topology the controller picks the only node (ListNodes).
	req := createReq("pvc-a", 64<<20, "")
	req.AccessibilityRequirements = nil
	resp, err := cc.CreateVolume(ctx, req)
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	vol := resp.GetVolume()
	if vol.GetVolumeId() != "pvc-a" || vol.GetCapacityBytes() < 64<<20 || vol.GetAccessibleTopology()[0].GetSegments()[v1alpha1.TopologyNodeKey] != localNode {
		t.Fatalf("CreateVolume returned %v", vol)
	}
	pi, err := p.Volume("pvc-a")
	if err != nil || pi.Size != 64<<20 || len(pi.Members) != 4 || pi.Health != pool.Healthy {
		t.Fatalf("pool volume %+v, %v: want 64 MiB over 4 healthy members", pi, err)
	}
	again, err := cc.CreateVolume(ctx, req)
	if err != nil || again.GetVolume().GetVolumeId() != "pvc-a" {
		t.Fatalf("repeated CreateVolume: %v, %v", again, err)
	}
	other := createReq("pvc-a", 128<<20, localNode)
	_, err = cc.CreateVolume(ctx, other)
	wantCode(t, err, codes.AlreadyExists, "pvc-a")
	_, err = cc.CreateVolume(ctx, createReq("pvc-huge", 4<<30, localNode))
	wantCode(t, err, codes.ResourceExhausted, localNode)
	if _, err := p.Volume("pvc-huge"); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("pool has pvc-huge: %v", err)
	}
	_, err = cc.CreateVolume(ctx, createReq("pvc-elsewhere", 64<<20, "other-node"))
	wantCode(t, err, codes.ResourceExhausted, "other-node")

	capAfter, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{})
	if err != nil || capAfter.GetAvailableCapacity() != int64(p.Capacity().LargestVolume) || capAfter.GetAvailableCapacity() >= capBefore.GetAvailableCapacity() {
		t.Fatalf("GetCapacity after a create = %v, %v: want the pool's %d, less than %d", capAfter, err, p.Capacity().LargestVolume, capBefore.GetAvailableCapacity())
	}

	exp, err := cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-a",
		CapacityRange: &csi.CapacityRange{RequiredBytes: 96 << 20}, VolumeCapability: mountCap("ext4")})
	if err != nil || exp.GetCapacityBytes() != 96<<20 || !exp.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume: %v, %v: want 96 MiB and node expansion", exp, err)
	}
	if pi, _ := p.Volume("pvc-a"); pi.Size != 96<<20 {
		t.Fatalf("pool volume is %d bytes after expand, want %d", pi.Size, 96<<20)
	}

	list, err := cc.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil || len(list.GetEntries()) != 1 {
		t.Fatalf("ListVolumes: %v, %v: want pvc-a only", list, err)
	}
	if e := list.GetEntries()[0]; e.GetVolume().GetVolumeId() != "pvc-a" {
		t.Fatalf("ListVolumes entry %v: want pvc-a", e)
	}

	for range 2 { // idempotent
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-a"}); err != nil {
			t.Fatalf("DeleteVolume: %v", err)
		}
	}
	if _, err := p.Volume("pvc-a"); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("pool still has pvc-a after DeleteVolume: %v", err)
	}
	if pc := p.Capacity().LargestVolume; int64(pc) != capBefore.GetAvailableCapacity() {
		t.Fatalf("largest volume %d after delete, want %d again", pc, capBefore.GetAvailableCapacity())
	}
	_, err = cc.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-a",
		VolumeCapabilities: []*csi.VolumeCapability{mountCap("ext4")}})
	wantCode(t, err, codes.NotFound, "pvc-a")
}

// TestLocalStoreRestart: what the pool cannot hold (volume mode, fsType, CSI name,
// annotations) survives a restart of the store and the pool through the records file, and
// the recovery rules for interrupted creates and deletes hold.
func TestLocalStoreRestart(t *testing.T) {
	p, cfg := openFilePool(t, 256<<20)
	records := filepath.Join(t.TempDir(), LocalRecordsFile)
	s := openLocalStore(t, p, records)
	c := &ControllerServer{store: s, locks: &VolumeLocks{}, readyTimeout: 5 * time.Second, pollInterval: 10 * time.Millisecond}
	ctx := context.Background()

	xfs := createReq("pvc-xfs", 32<<20, localNode)
	xfs.VolumeCapabilities = []*csi.VolumeCapability{mountCap("xfs")}
	block := createReq("pvc-block", 16<<20, localNode)
	block.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
	block.Parameters = map[string]string{ParamMembers: "2", ParamChunkSize: "64Ki"}
	for _, r := range []*csi.CreateVolumeRequest{xfs, block, createReq("pvc-gone", 16<<20, localNode), createReq("pvc-deleting", 16<<20, localNode)} {
		if _, err := c.CreateVolume(ctx, r); err != nil {
			t.Fatalf("CreateVolume %s: %v", r.Name, err)
		}
	}
	// A pool volume made outside the store (kubectl-raid10 --local) is none of its business.
	if _, err := p.CreateVolume("by-hand", 16<<20, pool.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	// Edit the state the way crashes leave it: pvc-deleting was marked deleting, pvc-pending's
	// create never returned (not in the pool), pvc-unflagged's create finished but its flag was
	// not written, and pvc-gone's extents were lost (the pool no longer has it).
	var f localRecords
	b, err := os.ReadFile(records)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &f); err != nil || f.Version != 1 || len(f.Volumes) != 4 {
		t.Fatalf("records file %s: %v: want version 1 with 4 volumes:\n%s", records, err, b)
	}
	for i := range f.Volumes {
		switch f.Volumes[i].Name {
		case "pvc-deleting":
			f.Volumes[i].Deleting = true
		case "pvc-block":
			f.Volumes[i].Provisioned = false
		}
	}
	pending := f.Volumes[0]
	pending.Name, pending.Provisioned = "pvc-pending", false
	f.Volumes = append(f.Volumes, pending)
	b, _ = json.Marshal(f)
	if err := os.WriteFile(records, b, 0o600); err != nil {
		t.Fatal(err)
	}
	p2, err := pool.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p2.Close() })
	if err := p2.DeleteVolume("pvc-gone"); err != nil {
		t.Fatal(err)
	}
	s2 := openLocalStore(t, p2, records)
	c2 := &ControllerServer{store: s2, locks: &VolumeLocks{}, readyTimeout: 2 * time.Second, pollInterval: 10 * time.Millisecond}

	vols, err := s2.ListVolumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vols {
		names = append(names, v.Name)
	}
	if strings.Join(names, ",") != "pvc-block,pvc-gone,pvc-xfs" {
		t.Fatalf("volumes after restart: %v, want pvc-block, pvc-gone, pvc-xfs (deleting finished, pending dropped, by-hand not listed)", names)
	}
	if _, err := p2.Volume("pvc-deleting"); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("the interrupted delete of pvc-deleting was not finished: %v", err)
	}
	if _, err := p2.Volume("by-hand"); err != nil {
		t.Fatalf("the pool volume made by hand was touched: %v", err)
	}

	got, err := s2.GetVolume(ctx, "pvc-xfs")
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.FSType != v1alpha1.FSTypeXFS || got.Spec.VolumeMode != v1alpha1.VolumeModeFilesystem ||
		got.Annotations[v1alpha1.CSINameAnnotation] != "pvc-xfs" || got.Annotations[v1alpha1.PVCNameAnnotation] != "data" ||
		got.Status.Phase != v1alpha1.VolumePhaseReady || got.Status.Health != v1alpha1.VolumeHealthHealthy {
		t.Fatalf("pvc-xfs after restart: spec %+v, annotations %v, status %s/%s", got.Spec, got.Annotations, got.Status.Phase, got.Status.Health)
	}
	if _, err := c2.CreateVolume(ctx, xfs); err != nil {
		t.Fatalf("repeated CreateVolume of pvc-xfs after restart: %v", err)
	}
	asExt4 := createReq("pvc-xfs", 32<<20, localNode) // same size, other filesystem
	_, err = c2.CreateVolume(ctx, asExt4)
	if codeOf(err) != codes.AlreadyExists {
		t.Fatalf("CreateVolume of pvc-xfs as ext4 after restart: %v, want AlreadyExists (fsType kept)", err)
	}
	blk, err := s2.GetVolume(ctx, "pvc-block")
	if err != nil || blk.Spec.VolumeMode != v1alpha1.VolumeModeBlock || blk.Spec.Layout.Members != 2 || blk.Status.Phase != v1alpha1.VolumePhaseReady {
		t.Fatalf("pvc-block after restart: %+v, %v: want a Ready 2-member block volume", blk, err)
	}
	if pi, err := p2.Volume("pvc-block"); err != nil || pi.ChunkSize != 64<<10 || len(pi.Members) != 2 {
		t.Fatalf("pool volume pvc-block: %+v, %v: want 2 members with 64 KiB chunks (the chunkSize parameter)", pi, err)
	}

	gone, err := s2.GetVolume(ctx, "pvc-gone")
	if err != nil {
		t.Fatal(err)
	}
	cond := agentReadyReason(gone)
	if gone.Status.Phase != v1alpha1.VolumePhaseFailed || cond != crstatus.ReasonNotInPool || gone.Status.Capacity == nil {
		t.Fatalf("pvc-gone: phase %s, reason %s, capacity %v: want Failed, NotInPool, a capacity", gone.Status.Phase, cond, gone.Status.Capacity)
	}
	_, err = c2.CreateVolume(ctx, createReq("pvc-gone", 16<<20, localNode))
	if codeOf(err) != codes.Internal {
		t.Fatalf("CreateVolume of the lost pvc-gone: %v, want Internal", err)
	}
	if _, err := p2.Volume("pvc-gone"); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("the lost pvc-gone was recreated blank: %v", err)
	}

	if err := os.WriteFile(records, []byte(`{"version": 2, "volumes": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewLocalStore(p2, localNode, records); err == nil || !strings.Contains(err.Error(), records) || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("NewLocalStore over a version 2 file: %v, want an error naming the file and its version", err)
	}
}

func agentReadyReason(v *v1alpha1.Raid10Volume) string {
	for _, c := range v.Status.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			return c.Reason
		}
	}
	return ""
}

// TestLocalStoreContract: the VolumeStore contract (ErrNotFound, ErrAlreadyExists,
// ErrConflict, the CRD's immutability rules), and a pool that refuses a volume for want of
// space, which the controller answers ResourceExhausted and cleans up, as with the agent.
func TestLocalStoreContract(t *testing.T) {
	p, _ := openFilePool(t, 128<<20)
	s := openLocalStore(t, p, filepath.Join(t.TempDir(), LocalRecordsFile))
	ctx := context.Background()
	newVol := func(name string, size int64) *v1alpha1.Raid10Volume {
		return newVolume(name, name, localNode, size, volumeParams{layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: DefaultChunkSizeBytes}},
			volumeShape{mode: v1alpha1.VolumeModeFilesystem, fsType: v1alpha1.FSTypeExt4})
	}
	v := newVol("vol-1", 16<<20)
	if err := s.CreateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	if v.ResourceVersion == "" || v.UID == "" || v.Generation != 1 {
		t.Fatalf("server-set fields not filled in: rv %q uid %q generation %d", v.ResourceVersion, v.UID, v.Generation)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"GetMissing", func() error { _, err := s.GetVolume(ctx, "nope"); return err }(), ErrNotFound},
		{"CreateExisting", s.CreateVolume(ctx, newVol("vol-1", 16<<20)), ErrAlreadyExists},
		{"CreateOtherNode", s.CreateVolume(ctx, func() *v1alpha1.Raid10Volume { o := newVol("vol-2", 16<<20); o.Spec.Node = "n2"; return o }()), ErrInvalidArgument},
		{"CreateBadName", s.CreateVolume(ctx, newVol("bad/name", 16<<20)), ErrInvalidArgument},
		{"UpdateMissing", s.UpdateVolume(ctx, newVol("nope", 16<<20)), ErrNotFound},
		{"UpdateStale", func() error { o := v.DeepCopy(); o.ResourceVersion = "0"; return s.UpdateVolume(ctx, o) }(), ErrConflict},
		{"Shrink", func() error { o := v.DeepCopy(); o.Spec.SizeBytes = 8 << 20; return s.UpdateVolume(ctx, o) }(), ErrInvalidArgument},
		{"MoveNode", func() error { o := v.DeepCopy(); o.Spec.Node = "n2"; return s.UpdateVolume(ctx, o) }(), ErrInvalidArgument},
		{"ChangeLayout", func() error { o := v.DeepCopy(); o.Spec.Layout.Members = 2; return s.UpdateVolume(ctx, o) }(), ErrInvalidArgument},
		{"GetOtherNode", func() error { _, err := s.GetNode(ctx, "n2"); return err }(), ErrNotFound},
		{"DeleteMissing", s.DeleteVolume(ctx, "nope"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, tc.want) || (tc.want == nil) != (tc.err == nil) {
				t.Fatalf("error %v, want %v", tc.err, tc.want)
			}
		})
	}

	// An update with the current resourceVersion raises the generation; the status follows.
	cur, err := s.GetVolume(ctx, "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.SizeBytes = 24 << 20
	if err := s.UpdateVolume(ctx, cur); err != nil || cur.Generation != 2 {
		t.Fatalf("UpdateVolume: %v, generation %d: want 2", err, cur.Generation)
	}
	cur, _ = s.GetVolume(ctx, "vol-1")
	if cur.Status.ObservedGeneration != 2 || cur.Status.Phase != v1alpha1.VolumePhaseReady || cur.Status.Capacity.Value() != 24<<20 {
		t.Fatalf("status after the update: %+v: want generation 2 observed, Ready, 24 MiB", cur.Status)
	}

	// vol-2 right after vol-1's extents: vol-1 cannot grow in place; the status says so
	// (phase Expanding, the pool's reason) instead of Ready, and the controller's wait for
	// the new size ends in DeadlineExceeded, not in a false success.
	if err := s.CreateVolume(ctx, newVol("vol-2", 16<<20)); err != nil {
		t.Fatal(err)
	}
	cur, _ = s.GetVolume(ctx, "vol-1")
	cur.Spec.SizeBytes = 64 << 20
	if err := s.UpdateVolume(ctx, cur); err != nil {
		t.Fatal(err)
	}
	cur, _ = s.GetVolume(ctx, "vol-1")
	if cur.Status.Phase != v1alpha1.VolumePhaseExpanding || !strings.Contains(cur.Status.Message, "expansion to 67108864 bytes pending") ||
		cur.Status.Capacity.Value() != 24<<20 {
		t.Fatalf("vol-1 that cannot grow: %+v: want phase Expanding, the reason, 24 MiB", cur.Status)
	}
	short := &ControllerServer{store: s, locks: &VolumeLocks{}, readyTimeout: 300 * time.Millisecond, pollInterval: 10 * time.Millisecond}
	if _, err := short.waitReady(ctx, "vol-1", 64<<20, false); codeOf(err) != codes.DeadlineExceeded {
		t.Fatalf("waitReady(vol-1 at 64 MiB) = %v, want DeadlineExceeded", err)
	}
	if err := s.DeleteVolume(ctx, "vol-2"); err != nil {
		t.Fatal(err)
	}

	node, err := s.GetNode(ctx, localNode)
	if err != nil || node.Status.HealthyDisks != 4 || len(node.Status.Disks) != 4 {
		t.Fatalf("GetNode: %+v, %v: want 4 healthy disks", node, err)
	}

	// The pool has no room (the controller's capacity check raced with another create): the
	// store reports the agent's Failed/InsufficientCapacity, the controller answers
	// ResourceExhausted and deletes the never-provisioned record.
	big := newVol("vol-big", 1<<30)
	if err := s.CreateVolume(ctx, big); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetVolume(ctx, "vol-big"); got.Status.Phase != v1alpha1.VolumePhaseFailed || agentReadyReason(got) != v1alpha1.ReasonInsufficientCapacity {
		t.Fatalf("vol-big status %+v: want Failed, InsufficientCapacity", got.Status)
	}
	c := &ControllerServer{store: s, locks: &VolumeLocks{}, readyTimeout: time.Second, pollInterval: 10 * time.Millisecond}
	if _, err := c.waitReady(ctx, "vol-big", 1<<30, true); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("waitReady(vol-big) = %v, want ResourceExhausted", err)
	}
	if _, err := s.GetVolume(ctx, "vol-big"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("vol-big still recorded after the failed create: %v", err)
	}
}

// attachedSet is an AttachedDevices that reports the volumes it holds as attached.
type attachedSet struct {
	mu   sync.Mutex
	devs map[string]string
}

func (a *attachedSet) Device(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.devs[id]
}

func (a *attachedSet) set(id, dev string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.devs[id] = dev
}

// TestLocalStoreDeleteAttached: DeleteVolume of a volume still attached (staged) is refused
// with FailedPrecondition and leaves the pool volume alone; after the detach it deletes.
func TestLocalStoreDeleteAttached(t *testing.T) {
	p, _ := openFilePool(t, 256<<20)
	s := openLocalStore(t, p, filepath.Join(t.TempDir(), LocalRecordsFile))
	devs := &attachedSet{devs: map[string]string{}}
	s.UseDevices(devs)
	cc, _, _ := startAllMode(t, s)
	ctx := context.Background()
	req := createReq("pvc-staged", 32<<20, "")
	req.AccessibilityRequirements = nil
	if _, err := cc.CreateVolume(ctx, req); err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	devs.set("pvc-staged", "/dev/nbd3")
	_, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-staged"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "/dev/nbd3") {
		t.Fatalf("DeleteVolume of an attached volume: %v, want FailedPrecondition naming /dev/nbd3", err)
	}
	if _, err := p.Volume("pvc-staged"); err != nil {
		t.Fatalf("the attached volume left the pool: %v", err)
	}
	devs.set("pvc-staged", "")
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-staged"}); err != nil {
		t.Fatalf("DeleteVolume after the detach: %v", err)
	}
	if _, err := p.Volume("pvc-staged"); !errors.Is(err, pool.ErrNotFound) {
		t.Fatalf("pool volume after the delete: %v, want not found", err)
	}
}
