package main

// The API clients: in cluster mode a controller-runtime client of the API server (the
// Raid10Node, Raid10Volume and Raid10Snapshot resources and their events.k8s.io Events); in
// local mode admin.API, the admin socket of the process that holds the node's pool or the
// pool opened in this process.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// errNotFound marks errors about a node, disk or volume that does not exist (cluster mode).
var errNotFound = errors.New("not found")

// withCluster checks the options, then runs fn with a client of the cluster and a renderer
// of out.
func withCluster(o *Options, out io.Writer, fn func(client.Client, renderer) error) error {
	if err := o.Validate(); err != nil {
		return err
	}
	c, err := clusterClient(o)
	if err != nil {
		return err
	}
	return fn(c, renderer{o: o, w: out})
}

// clusterClient returns a client of the cluster that the kubeconfig names: --kubeconfig,
// else $KUBECONFIG, else ~/.kube/config (kubectl's own order), and --context.
func clusterClient(o *Options) (client.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.Context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-raid10"
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return client.New(cfg, client.Options{Scheme: s})
}

// listAll reads every Raid10Node and Raid10Volume, sorted by name.
func listAll(ctx context.Context, c client.Client) ([]v1alpha1.Raid10Node, []v1alpha1.Raid10Volume, error) {
	var nl v1alpha1.Raid10NodeList
	if err := c.List(ctx, &nl); err != nil {
		return nil, nil, fmt.Errorf("list Raid10Nodes: %w", err)
	}
	var vl v1alpha1.Raid10VolumeList
	if err := c.List(ctx, &vl); err != nil {
		return nil, nil, fmt.Errorf("list Raid10Volumes: %w", err)
	}
	slices.SortFunc(nl.Items, func(a, b v1alpha1.Raid10Node) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(vl.Items, func(a, b v1alpha1.Raid10Volume) int { return strings.Compare(a.Name, b.Name) })
	return nl.Items, vl.Items, nil
}

// listSnapshots reads every Raid10Snapshot (of volume source, when not empty), by name.
func listSnapshots(ctx context.Context, c client.Client, source string) ([]v1alpha1.Raid10Snapshot, error) {
	var l v1alpha1.Raid10SnapshotList
	if err := c.List(ctx, &l); err != nil {
		return nil, fmt.Errorf("list Raid10Snapshots: %w", err)
	}
	var out []v1alpha1.Raid10Snapshot
	for _, s := range l.Items {
		if source == "" || s.Spec.Source == source {
			out = append(out, s)
		}
	}
	return out, nil
}

// unknownNode is the error about a node with no Raid10Node, naming the nodes that have one.
func unknownNode(name string, nodes []v1alpha1.Raid10Node) error {
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	known := "none: is the node plugin installed and running?"
	if len(names) > 0 {
		known = strings.Join(names, ", ")
	}
	return fmt.Errorf("unknown node %q: no Raid10Node of that name (nodes with a pool: %s): %w", name, known, errNotFound)
}

// unknownVolume is the error about a volume with no Raid10Volume.
func unknownVolume(name string) error {
	return fmt.Errorf("unknown volume %q: no Raid10Volume of that name: %w", name, errNotFound)
}

// volumeEvents lists the events.k8s.io Events about the object kind/name with uid (or with
// no uid recorded), oldest first.
func volumeEvents(ctx context.Context, c client.Client, kind, name string, uid types.UID) ([]eventsv1.Event, error) {
	var el eventsv1.EventList
	sel := fields.Set{"regarding.kind": kind, "regarding.name": name}.AsSelector()
	if err := c.List(ctx, &el, client.MatchingFieldsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("list Events: %w", err)
	}
	var evs []eventsv1.Event
	for _, e := range el.Items {
		if e.Regarding.UID == "" || e.Regarding.UID == uid {
			evs = append(evs, e)
		}
	}
	slices.SortStableFunc(evs, func(a, b eventsv1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	return evs, nil
}

// eventTime is when an event last happened.
func eventTime(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.DeprecatedLastTimestamp.IsZero():
		return e.DeprecatedLastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// withPool checks the options, connects to the node's pool and runs fn with it and a
// renderer of out; the connection is closed after.
func withPool(ctx context.Context, o *Options, out io.Writer, fn func(admin.API, renderer) error) error {
	if err := o.Validate(); err != nil {
		return err
	}
	api, err := connect(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = api.Close() }()
	return fn(api, renderer{o: o, w: out})
}

// connect returns the API of the process that holds the pool (the standalone agent's admin
// socket in --run-dir, else the plugin's in --state-dir), or the pool opened in this process
// when neither answers and a pool configuration is given.
func connect(ctx context.Context, o *Options) (admin.API, error) {
	var socks []string
	for _, dir := range []string{o.RunDir, o.StateDir} {
		if dir == "" {
			continue
		}
		sock := admin.Socket(dir)
		socks = append(socks, sock)
		if _, err := os.Stat(sock); err != nil {
			continue
		}
		h, err := admin.Dial(ctx, sock)
		if err == nil {
			return h, nil
		}
		if o.PoolConfig == "" {
			return nil, fmt.Errorf("agent at %s does not answer: %w", sock, err)
		}
	}
	if o.PoolConfig == "" {
		return nil, fmt.Errorf("no node agent at %s and no --pool-config to open the pool directly", strings.Join(socks, " or "))
	}
	cfg, err := pool.LoadConfig(o.PoolConfig)
	if err != nil {
		return nil, err
	}
	// The plugin's record of the disks given at run time, when its state directory is here:
	// the same disks, and a disk replaced now is found by the plugin's next start.
	if st, err := os.Stat(o.StateDir); cfg.DisksFile == "" && o.StateDir != "" && err == nil && st.IsDir() {
		cfg.DisksFile = filepath.Join(o.StateDir, pool.DisksFileName)
	}
	p, err := pool.Open(cfg)
	if err != nil {
		return nil, err
	}
	return admin.Direct{P: p}, nil
}
