package driver

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

// crdDir holds the generated CRDs, as the chart ships them.
const crdDir = "../../charts/raid10-csi/crds"

// realClient starts etcd and kube-apiserver (test/kubeenv: skipped without `make deps`,
// failed under CI), installs the chart's CRDs and returns a client for the raid10 types.
func realClient(t *testing.T) (client.Client, *rest.Config) {
	t.Helper()
	// No endpoint reconciler: kube-apiserver v1.37 refuses to reconcile the "kubernetes"
	// Service endpoints to a loopback --advertise-address, and these tests need none.
	env := kubeenv.Start(t, kubeenv.WithAPIServerFlags("--endpoint-reconciler-type=none"))
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1alpha1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	// One that can watch: the controller's waits watch the volume they wait for.
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	if names := env.InstallCRDs(t, crdDir); len(names) != 3 {
		t.Fatalf("CRDs in %s: %v, want Raid10Volume, Raid10Node and Raid10Snapshot", crdDir, names)
	}
	ctx := t.Context()
	// The discovery cache of a fresh client may miss the new kinds for a moment.
	waitFor(t, func() bool {
		var l v1alpha1.Raid10VolumeList
		return c.List(ctx, &l) == nil
	})
	return c, env.Config
}

// TestControllerRealAPIServer runs the controller suite (CreateVolume waits for a node agent
// played by a test goroutine, capacity checks, expansion, deletion through the finalizer)
// against a real kube-apiserver with the generated CRDs.
func TestControllerRealAPIServer(t *testing.T) {
	c, cfg := realClient(t)
	controllerSuite(t, c)
	t.Run("CRDValidation", func(t *testing.T) { crdValidation(t, c) })
	t.Run("PrinterColumns", func(t *testing.T) { printerColumns(t, c, cfg) })
	t.Run("CapacityFromCache", func(t *testing.T) { capacityFromCache(t, c, cfg) })
}

// crdValidation: the API server enforces the schema's rules (even members, a power-of-two
// chunk, no shrinking, an immutable node).
func crdValidation(t *testing.T, c client.Client) {
	ctx := t.Context()
	good := func(name string) *v1alpha1.Raid10Volume {
		v := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
			Node: "node-v", SizeBytes: gib, VolumeMode: v1alpha1.VolumeModeFilesystem, FSType: v1alpha1.FSTypeExt4,
			Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
		}}
		v.Name = name
		return v
	}
	for _, tc := range []struct {
		name string
		mod  func(*v1alpha1.Raid10Volume)
		msg  string
	}{
		{"OddMembers", func(v *v1alpha1.Raid10Volume) { v.Spec.Layout.Members = 3 }, "members must be even"},
		{"ChunkNotPowerOfTwo", func(v *v1alpha1.Raid10Volume) { v.Spec.Layout.ChunkSizeBytes = 96 << 10 }, "power of two"},
		{"FilesystemWithoutFSType", func(v *v1alpha1.Raid10Volume) { v.Spec.FSType = "" }, "fsType is required"},
		{"Btrfs", func(v *v1alpha1.Raid10Volume) { v.Spec.FSType = "btrfs" }, "fsType"},
		{"NegativeLimit", func(v *v1alpha1.Raid10Volume) { v.Spec.Limits = &v1alpha1.VolumeLimits{WriteIOPS: -1} }, "spec.limits.writeIOPS"},
		{"NegativeRate", func(v *v1alpha1.Raid10Volume) { v.Spec.Rates = &v1alpha1.VolumeRates{ScrubRateMax: -1} }, "spec.rates.scrubRateMax"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := good("bad-" + strings.ToLower(tc.name))
			tc.mod(v)
			err := c.Create(ctx, v)
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("Create = %v, want Invalid mentioning %q", err, tc.msg)
			}
		})
	}
	v := good("valid")
	if err := c.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	// The test agent may write the object's status meanwhile: each update starts from the
	// object as it is now, and a conflict is retried.
	update := func(mod func(*v1alpha1.Raid10Volume)) error {
		for {
			cur := &v1alpha1.Raid10Volume{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(v), cur); err != nil {
				return err
			}
			mod(cur)
			if err := c.Update(ctx, cur); !apierrors.IsConflict(err) {
				return err
			}
		}
	}
	if err := update(func(v *v1alpha1.Raid10Volume) { v.Spec.SizeBytes = gib / 2 }); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "may not shrink") {
		t.Fatalf("shrink: %v", err)
	}
	if err := update(func(v *v1alpha1.Raid10Volume) { v.Spec.Node = "node-w" }); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "immutable") {
		t.Fatalf("move: %v", err)
	}
	if err := c.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
}

// printerColumns: `kubectl get r10v` and `kubectl get r10n` show the columns. kubectl
// asks the API server for a Table, as this does.
func printerColumns(t *testing.T, c client.Client, cfg *rest.Config) {
	ctx := t.Context()
	v := &v1alpha1.Raid10Volume{Spec: v1alpha1.Raid10VolumeSpec{
		Node: "node-p", SizeBytes: 10 * gib, VolumeMode: v1alpha1.VolumeModeBlock,
		Layout: v1alpha1.Layout{Members: 4, ChunkSizeBytes: 512 << 10},
	}}
	v.Name = "pvc-printed"
	if err := c.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	// Observed and Ready at its size: the test agent leaves it alone once node-p exists.
	v.Status = v1alpha1.Raid10VolumeStatus{
		ObservedGeneration: v.Generation,
		Phase:              v1alpha1.VolumePhaseReady, Health: v1alpha1.VolumeHealthRebuilding, InSync: "3/4",
		BadBlocks: 7, LostBlocks: 1,
		Capacity: resource.NewQuantity(10*gib, resource.BinarySI),
		Rebuild:  &v1alpha1.RebuildProgress{Member: 2, Percent: 42, DoneBytes: 2 * gib, TotalBytes: 5 * gib, StartTime: &metav1.Time{Time: time.Now()}},
	}
	if err := c.Status().Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	newNode(ctx, t, c, "node-p", 4, 10*gib)

	for _, tc := range []struct {
		resource string
		columns  []string
		row      []any
	}{
		{"raid10volumes", []string{"Name", "Node", "Size", "State", "Health", "Members", "BadBlocks", "Rebuild", "Age"},
			[]any{"pvc-printed", "node-p", "10Gi", "Ready", "Rebuilding", "3/4", float64(7), float64(42)}},
		{"raid10nodes", []string{"Name", "Disks", "Healthy", "Usable", "Free", "Age"},
			[]any{"node-p", float64(4), float64(4), "20Gi", "20Gi"}},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			table := getTable(ctx, t, cfg, tc.resource, tc.row[0].(string))
			var names []string
			for _, col := range table.ColumnDefinitions {
				if col.Priority == 0 {
					names = append(names, col.Name)
				}
			}
			if !slices.Equal(names, tc.columns) {
				t.Fatalf("columns %v, want %v", names, tc.columns)
			}
			if len(table.Rows) != 1 {
				t.Fatalf("%d rows", len(table.Rows))
			}
			for i, want := range tc.row {
				if got := table.Rows[0].Cells[i]; got != want {
					t.Errorf("column %s = %#v, want %#v", tc.columns[i], got, want)
				}
			}
		})
	}
}

// getTable fetches one object as kubectl get does (server-side printing).
func getTable(ctx context.Context, t *testing.T, cfg *rest.Config, res, name string) *metav1.Table {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/apis", v1alpha1.GroupName, "v1alpha1", res).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		Param("fieldSelector", "metadata.name="+name).DoRaw(ctx)
	if err != nil {
		t.Fatalf("get %s as Table: %v", res, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	return &table
}
