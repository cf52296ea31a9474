package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

const gib = int64(1) << 30

// fakeClient is a controller-runtime fake client with the raid10 types and their status
// subresources: the unit-test layer under KubeStore.
func fakeClient(t *testing.T) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).
		WithStatusSubresource(&v1alpha1.Raid10Volume{}, &v1alpha1.Raid10Node{}, &v1alpha1.Raid10Snapshot{}).
		// spec.node is a selectable field of the CRDs (the API server filters on it); the fake
		// client needs an index for the KubeStore's per-node lists.
		WithIndex(&v1alpha1.Raid10Volume{}, NodeField, func(o client.Object) []string { return []string{o.(*v1alpha1.Raid10Volume).Spec.Node} }).
		WithIndex(&v1alpha1.Raid10Snapshot{}, NodeField, func(o client.Object) []string { return []string{o.(*v1alpha1.Raid10Snapshot).Spec.Node} }).
		Build()
}

// startDriver serves a controller-mode Driver over c on a unix socket in a temp dir and
// returns gRPC clients of it, through the real interceptor.
func startDriver(t *testing.T, c client.Client, readyTimeout time.Duration) (csi.ControllerClient, csi.IdentityClient) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	d, err := NewDriver(WithMode(ModeController), WithEndpoint("unix://"+sock), WithVersion("test"),
		WithVolumeStore(NewKubeStore(c)), WithReadyTimeout(readyTimeout), WithPollInterval(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver Run: %v", err)
		}
	})
	return csi.NewControllerClient(conn), csi.NewIdentityClient(conn)
}

func mountCap(fs string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER},
	}
}

func onNode(node string) *csi.TopologyRequirement {
	t := []*csi.Topology{{Segments: map[string]string{v1alpha1.TopologyNodeKey: node}}}
	return &csi.TopologyRequirement{Requisite: t, Preferred: t}
}

func createReq(name string, bytes int64, node string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:                      name,
		CapacityRange:             &csi.CapacityRange{RequiredBytes: bytes},
		VolumeCapabilities:        []*csi.VolumeCapability{mountCap("ext4")},
		Parameters:                map[string]string{ParamMembers: "4", "csi.storage.k8s.io/pvc/name": "data"},
		AccessibilityRequirements: onNode(node),
	}
}

// wantCode fails unless err has gRPC code want and, when sub is not empty, a message
// containing sub.
func wantCode(t *testing.T, err error, want codes.Code, sub string) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("code %v (%v), want %v", got, err, want)
	}
	if sub != "" && !strings.Contains(status.Convert(err).Message(), sub) {
		t.Fatalf("message %q does not name %q", status.Convert(err).Message(), sub)
	}
}

// controllerSuite is the controller service's behaviour over any client: the fake one here,
// the real kube-apiserver in apiserver_test.go.
func controllerSuite(t *testing.T, c client.Client) {
	ctx := t.Context()
	newNode(ctx, t, c, "node-a", 4, 10*gib) // 20 GiB usable with 4 members
	newNode(ctx, t, c, "node-b", 2, 4*gib)  // 4 GiB usable with 2 members, none with 4
	agent := &testAgent{c: c, t: t}
	actx, stop := context.WithCancel(ctx)
	agentDone := make(chan struct{})
	go func() { agent.run(actx); close(agentDone) }()
	t.Cleanup(func() { stop(); <-agentDone })
	cc, ic := startDriver(t, c, 3*time.Second)

	t.Run("Identity", func(t *testing.T) {
		info, err := ic.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		if err != nil || info.GetName() != v1alpha1.DriverName {
			t.Fatalf("GetPluginInfo = %v, %v", info, err)
		}
		caps, err := ic.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		if err != nil || len(caps.GetCapabilities()) != 3 {
			t.Fatalf("GetPluginCapabilities = %v, %v", caps, err)
		}
	})

	t.Run("CreateWaitsForAgentAndIsIdempotent", func(t *testing.T) {
		req := createReq("pvc-0001", 2*gib, "node-a")
		resp, err := cc.CreateVolume(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		v := resp.GetVolume()
		if v.GetVolumeId() != "pvc-0001" || v.GetCapacityBytes() != 2*gib ||
			v.GetAccessibleTopology()[0].GetSegments()[v1alpha1.TopologyNodeKey] != "node-a" {
			t.Fatalf("volume = %v", v)
		}
		var vol v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: "pvc-0001"}, &vol); err != nil {
			t.Fatal(err)
		}
		if vol.Status.Phase != v1alpha1.VolumePhaseReady || vol.Spec.Layout.Members != 4 ||
			vol.Annotations[v1alpha1.PVCNameAnnotation] != "data" || vol.Finalizers[0] != v1alpha1.VolumeFinalizer {
			t.Fatalf("Raid10Volume = %+v", vol)
		}
		again, err := cc.CreateVolume(ctx, req)
		if err != nil || again.GetVolume().GetVolumeId() != "pvc-0001" {
			t.Fatalf("second CreateVolume = %v, %v", again, err)
		}
	})

	t.Run("CreateErrors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			mod  func(*csi.CreateVolumeRequest)
			code codes.Code
			sub  string
		}{
			{"SameNameOtherSize", func(r *csi.CreateVolumeRequest) { r.Name = "pvc-0001"; r.CapacityRange.RequiredBytes = 3 * gib }, codes.AlreadyExists, "pvc-0001"},
			{"SameNameOtherLayout", func(r *csi.CreateVolumeRequest) { r.Name = "pvc-0001"; r.Parameters[ParamMembers] = "2" }, codes.AlreadyExists, "members"},
			{"UnknownParameter", func(r *csi.CreateVolumeRequest) { r.Parameters["stripes"] = "3" }, codes.InvalidArgument, "stripes"},
			{"OddMembers", func(r *csi.CreateVolumeRequest) { r.Parameters[ParamMembers] = "3" }, codes.InvalidArgument, "members"},
			{"BadChunk", func(r *csi.CreateVolumeRequest) { r.Parameters[ParamChunkSize] = "3Ki" }, codes.InvalidArgument, "chunkSize"},
			{"NoName", func(r *csi.CreateVolumeRequest) { r.Name = "" }, codes.InvalidArgument, "name"},
			{"NoCapabilities", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = nil }, codes.InvalidArgument, "volume_capabilities"},
			{"MultiNode", func(r *csi.CreateVolumeRequest) {
				r.VolumeCapabilities[0].AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
			}, codes.InvalidArgument, "access_mode"},
			{"Btrfs", func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities[0] = mountCap("btrfs") }, codes.InvalidArgument, "fs_type"},
			{"LimitBelowRequired", func(r *csi.CreateVolumeRequest) { r.CapacityRange.LimitBytes = gib }, codes.OutOfRange, "limit_bytes"},
			{"TooBigForNode", func(r *csi.CreateVolumeRequest) { r.CapacityRange.RequiredBytes = 25 * gib }, codes.ResourceExhausted, "node-a"},
			{"NoSuchLayoutOnNode", func(r *csi.CreateVolumeRequest) { r.AccessibilityRequirements = onNode("node-b") }, codes.ResourceExhausted, "node-b"},
			{"NoAgentOnNode", func(r *csi.CreateVolumeRequest) { r.AccessibilityRequirements = onNode("node-x") }, codes.ResourceExhausted, "node-x"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				req := createReq("pvc-err-"+strings.ToLower(tc.name), 2*gib, "node-a")
				tc.mod(req)
				_, err := cc.CreateVolume(ctx, req)
				wantCode(t, err, tc.code, tc.sub)
			})
		}
	})

	t.Run("FreeCapacityIsChecked", func(t *testing.T) {
		// 18 GiB usable left on node-a; 19 GiB does not fit now, 18 GiB does.
		_, err := cc.CreateVolume(ctx, createReq("pvc-big", 19*gib, "node-a"))
		wantCode(t, err, codes.ResourceExhausted, "free")
		if _, err := cc.CreateVolume(ctx, createReq("pvc-big", 18*gib, "node-a")); err != nil {
			t.Fatal(err)
		}
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-big"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ConcurrentOperationIsAborted", func(t *testing.T) {
		agent.setHold(true)
		first := make(chan error, 1)
		go func() {
			_, err := cc.CreateVolume(ctx, createReq("pvc-slow", gib, "node-a"))
			first <- err
		}()
		waitFor(t, func() bool {
			var v v1alpha1.Raid10Volume
			return c.Get(ctx, client.ObjectKey{Name: "pvc-slow"}, &v) == nil
		})
		_, err := cc.CreateVolume(ctx, createReq("pvc-slow", gib, "node-a"))
		wantCode(t, err, codes.Aborted, "in progress")
		agent.setHold(false)
		if err := <-first; err != nil {
			t.Fatalf("first CreateVolume: %v", err)
		}
	})

	t.Run("AgentTooSlowIsDeadlineExceededAndRetryResumes", func(t *testing.T) {
		agent.setHold(true)
		_, err := cc.CreateVolume(ctx, createReq("pvc-late", gib, "node-a"))
		wantCode(t, err, codes.DeadlineExceeded, "pvc-late")
		agent.setHold(false)
		if _, err := cc.CreateVolume(ctx, createReq("pvc-late", gib, "node-a")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("AgentReportsInsufficientCapacity", func(t *testing.T) {
		agent.setFail(v1alpha1.ReasonInsufficientCapacity)
		_, err := cc.CreateVolume(ctx, createReq("pvc-nospace", gib, "node-a"))
		agent.setFail("")
		wantCode(t, err, codes.ResourceExhausted, "Failed")
		waitFor(t, func() bool { // deleted, so that a retry starts afresh
			var v v1alpha1.Raid10Volume
			return c.Get(ctx, client.ObjectKey{Name: "pvc-nospace"}, &v) != nil
		})
	})

	t.Run("Block", func(t *testing.T) {
		req := createReq("pvc-block", gib, "node-a")
		req.VolumeCapabilities = []*csi.VolumeCapability{blockCap()}
		if _, err := cc.CreateVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
		ok, err := cc.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-block", VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
		if err != nil || ok.GetConfirmed() == nil {
			t.Fatalf("ValidateVolumeCapabilities(block) = %v, %v", ok, err)
		}
		no, err := cc.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-block", VolumeCapabilities: []*csi.VolumeCapability{mountCap("xfs")}})
		if err != nil || no.GetConfirmed() != nil || no.GetMessage() == "" {
			t.Fatalf("ValidateVolumeCapabilities(mount) = %v, %v", no, err)
		}
		_, err = cc.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-none", VolumeCapabilities: []*csi.VolumeCapability{blockCap()}})
		wantCode(t, err, codes.NotFound, "pvc-none")
	})

	t.Run("Expand", func(t *testing.T) {
		resp, err := cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-0001", CapacityRange: &csi.CapacityRange{RequiredBytes: 3 * gib}})
		if err != nil || resp.GetCapacityBytes() != 3*gib || !resp.GetNodeExpansionRequired() {
			t.Fatalf("ControllerExpandVolume = %v, %v", resp, err)
		}
		again, err := cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-0001", CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}})
		if err != nil || again.GetCapacityBytes() != 3*gib {
			t.Fatalf("ControllerExpandVolume(smaller) = %v, %v", again, err)
		}
		_, err = cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-0001", CapacityRange: &csi.CapacityRange{RequiredBytes: 100 * gib}})
		wantCode(t, err, codes.ResourceExhausted, "node-a")
		_, err = cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-none", CapacityRange: &csi.CapacityRange{RequiredBytes: gib}})
		wantCode(t, err, codes.NotFound, "pvc-none")
	})

	// A growth the agent reports Expanding (the pool refused it for now) is answered at once,
	// retryable, with the agent's reason; node expansion is asked for Filesystem and for Block
	// (whose /dev/nbdX learns the new size on the node).
	t.Run("ExpandPendingAndNodeExpansion", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			vc   *csi.VolumeCapability // at create
			req  *csi.VolumeCapability // in the expand request
		}{
			{"Filesystem", mountCap("ext4"), nil},
			{"FilesystemCapability", mountCap("xfs"), mountCap("xfs")},
			{"Block", blockCap(), nil},
			{"BlockCapability", blockCap(), blockCap()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				id := "pvc-grow-" + strings.ToLower(tc.name)
				creq := createReq(id, gib, "node-a")
				creq.VolumeCapabilities = []*csi.VolumeCapability{tc.vc}
				if _, err := cc.CreateVolume(ctx, creq); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
						t.Errorf("delete %s: %v", id, err)
					}
				}()
				expand := func() (*csi.ControllerExpandVolumeResponse, error) {
					return cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id,
						CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}, VolumeCapability: tc.req})
				}
				agent.setPending("expansion to 2147483648 bytes pending: pool: volume is Degraded; expand it once it is Healthy")
				start := time.Now()
				_, err := expand()
				agent.setPending("")
				wantCode(t, err, codes.Aborted, "is Degraded; expand it once it is Healthy")
				if !strings.Contains(status.Convert(err).Message(), "pending on the node agent") {
					t.Fatalf("message %q does not say the expansion is pending", status.Convert(err).Message())
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Fatalf("answered after %s: waited instead of reporting the pending expansion", d)
				}
				// The status says Expanding until the agent's next pass: like the resizer, retry
				// while Aborted.
				resp, err := expand()
				for deadline := time.Now().Add(5 * time.Second); status.Code(err) == codes.Aborted && time.Now().Before(deadline); {
					time.Sleep(50 * time.Millisecond)
					resp, err = expand()
				}
				if err != nil || resp.GetCapacityBytes() != 2*gib || !resp.GetNodeExpansionRequired() {
					t.Fatalf("ControllerExpandVolume = %v, %v; want %d bytes and node expansion", resp, err, 2*gib)
				}
			})
		}
	})

	t.Run("GetCapacity", func(t *testing.T) {
		// node-a: 40 GiB raw; pvc-0001 (3), pvc-slow (1), pvc-late (1), pvc-block (1) use 6 GiB usable.
		for _, tc := range []struct {
			name   string
			topo   *csi.Topology
			params map[string]string
			want   int64
		}{
			{"NodeA", &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-a"}}, nil, 14 * gib},
			{"NodeBFourMembers", &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-b"}}, nil, 0},
			{"NodeBTwoMembers", &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-b"}}, map[string]string{ParamMembers: "2"}, 4 * gib},
			{"UnknownNode", &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-x"}}, nil, 0},
			{"AllNodesTwoMembers", nil, map[string]string{ParamMembers: "2"}, 7*gib + 4*gib},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: tc.topo, Parameters: tc.params})
				if err != nil || resp.GetAvailableCapacity() != tc.want {
					t.Fatalf("GetCapacity = %v, %v; want %d", resp, err, tc.want)
				}
			})
		}
		// A bad parameter answers the default layout's capacity (CreateVolume names it).
		bad, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-a"}}, Parameters: map[string]string{"bogus": "1"}})
		if err != nil || bad.GetAvailableCapacity() != 14*gib {
			t.Fatalf("GetCapacity with an unknown parameter = %v, %v; want the default layout's 14 GiB", bad, err)
		}
	})

	t.Run("ListVolumes", func(t *testing.T) {
		var vol v1alpha1.Raid10Volume
		if err := c.Get(ctx, client.ObjectKey{Name: "pvc-late"}, &vol); err != nil {
			t.Fatal(err)
		}
		agent.setHold(true)
		defer agent.setHold(false)
		vol.Status.Health = v1alpha1.VolumeHealthDegraded
		vol.Status.InSync = "3/4"
		if err := c.Status().Update(ctx, &vol); err != nil {
			t.Fatal(err)
		}
		var all []*csi.ListVolumesResponse_Entry
		token := ""
		for {
			resp, err := cc.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, resp.GetEntries()...)
			if token = resp.GetNextToken(); token == "" {
				break
			}
		}
		if len(all) != 4 {
			t.Fatalf("ListVolumes gave %d entries, want 4: %v", len(all), all)
		}
		_, err := cc.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "99"})
		wantCode(t, err, codes.Aborted, "starting_token")
	})

	t.Run("Health", func(t *testing.T) { healthSuite(t, c, cc, agent) })

	t.Run("DeleteFreesSpaceAndIsIdempotent", func(t *testing.T) {
		for _, id := range []string{"pvc-0001", "pvc-0001", "pvc-slow", "pvc-late", "pvc-block", "never-existed"} {
			if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				t.Fatalf("DeleteVolume(%s): %v", id, err)
			}
		}
		var vols v1alpha1.Raid10VolumeList
		if err := c.List(ctx, &vols); err != nil || len(vols.Items) != 0 {
			t.Fatalf("volumes left: %v, %v", vols.Items, err)
		}
		resp, err := cc.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyNodeKey: "node-a"}}})
		if err != nil || resp.GetAvailableCapacity() != 20*gib {
			t.Fatalf("GetCapacity after deletes = %v, %v", resp, err)
		}
	})

	t.Run("Snapshots", func(t *testing.T) { snapshotSuite(t, c, cc, agent) })

	t.Run("DeleteWaitsForFinalizer", func(t *testing.T) {
		if _, err := cc.CreateVolume(ctx, createReq("pvc-held", gib, "node-a")); err != nil {
			t.Fatal(err)
		}
		agent.setHold(true)
		_, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-held"})
		wantCode(t, err, codes.DeadlineExceeded, "pvc-held")
		agent.setHold(false)
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-held"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Modify", func(t *testing.T) { modifySuite(t, c, cc) })

	t.Run("WaitWatches", func(t *testing.T) { waitSuite(t, c, agent) })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestControllerFakeClient runs the controller suite over controller-runtime's fake client
// (one layer; the same suite runs against a real kube-apiserver in apiserver_test.go).
func TestControllerFakeClient(t *testing.T) {
	controllerSuite(t, fakeClient(t))
}

func TestNewDriverOptions(t *testing.T) {
	ns, _, _, _ := newTestNode(t)
	store := NewKubeStore(nil)
	for _, tc := range []struct {
		name string
		opts []Option
		want error
	}{
		{"NoEndpoint", []Option{WithVolumeStore(store)}, ErrInvalidArgument},
		{"ControllerWithoutStore", []Option{WithEndpoint("unix:///x.sock")}, ErrInvalidArgument},
		{"NodeWithoutNodeService", []Option{WithEndpoint("unix:///x.sock"), WithMode(ModeNode)}, ErrInvalidArgument},
		{"Node", []Option{WithEndpoint("unix:///x.sock"), WithMode(ModeNode), WithNodeService(ns)}, nil},
		{"AllWithoutStore", []Option{WithEndpoint("unix:///x.sock"), WithMode(ModeAll), WithNodeService(ns)}, ErrInvalidArgument},
		{"AllWithoutNodeService", []Option{WithEndpoint("unix:///x.sock"), WithMode(ModeAll), WithVolumeStore(store)}, ErrInvalidArgument},
		{"All", []Option{WithEndpoint("unix:///x.sock"), WithMode(ModeAll), WithVolumeStore(store), WithNodeService(ns)}, nil},
		{"BadMode", []Option{WithEndpoint("unix:///x.sock"), WithMode("both")}, ErrInvalidArgument},
		{"Controller", []Option{WithEndpoint("unix:///x.sock"), WithVolumeStore(NewKubeStore(nil))}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewDriver(tc.opts...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("NewDriver: %v, want %v", err, tc.want)
			}
		})
	}
}
