package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// Cluster mode reads and writes the custom resources: Raid10Node (one per node, its disks
// and capacity, written by the node agent) and Raid10Volume (one per volume), and the
// events.k8s.io Events the agent records about them. The only write is replace-disk, which
// sets a Raid10Node's spec.diskReplacement for that node's agent to carry out.

// errNotFound marks errors about a node, disk or volume that does not exist (cluster mode).
var errNotFound = errors.New("not found")

// localOnly are the commands that act on one node's pool directly: in a cluster, volumes
// come from PersistentVolumeClaims and disks change through replace-disk.
var localOnly = map[string]bool{"create": true, "delete": true, "expand": true, "disk": true, "wait": true, "serve": true}

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

// runCluster executes a cluster-mode command.
func runCluster(ctx context.Context, o *Options, args []string, out io.Writer) error {
	cmd, rest := args[0], args[1:]
	if localOnly[cmd] {
		return fmt.Errorf("%q works on one node's pool: run it there with --local (in a cluster, volumes come from PersistentVolumeClaims; disks change with replace-disk)", cmd)
	}
	if cmd == "scrub" {
		return runClusterScrub(ctx, o, rest, out)
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.StringVar(&o.Output, "o", o.Output, "output format: table, json or yaml")
	// Also after the command, where kubectl users put them.
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context")
	var (
		wipe    bool
		follow  bool
		timeout time.Duration
		pos     []string
		err     error
	)
	switch cmd {
	case "status":
		pos, err = parseArgs(fs, rest, 0, 0, "status")
	case "volumes":
		pos, err = parseArgs(fs, rest, 0, 1, "volumes [NAME]")
	case "snapshots":
		pos, err = parseArgs(fs, rest, 0, 1, "snapshots [VOLUME]")
	case "disks":
		pos, err = parseArgs(fs, rest, 0, 1, "disks [NODE]")
	case "describe":
		pos, err = parseArgs(fs, rest, 2, 2, "describe volume NAME")
		if err == nil && pos[0] != "volume" && pos[0] != "r10v" {
			err = fmt.Errorf("describe: unknown kind %q: usage: describe volume NAME", pos[0])
		}
	case "replace-disk":
		fs.BoolVar(&wipe, "wipe", false, "let the agent erase a foreign signature on the new disk")
		fs.BoolVar(&follow, "follow", false, "then follow the rebuild of the affected volumes until they are Healthy")
		fs.DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the node agent's answer (and, with --follow, for each rebuild)")
		pos, err = parseArgs(fs, rest, 3, 3, "replace-disk NODE OLD-DISK NEW-PATH [--wipe] [--follow] [--timeout 2m]")
	default:
		return fmt.Errorf("unknown command %q (see kubectl-raid10 help)", cmd)
	}
	if err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	c, err := clusterClient(o)
	if err != nil {
		return err
	}
	r := renderer{o: o, w: out}
	switch cmd {
	case "status":
		nodes, vols, err := listAll(ctx, c)
		if err != nil {
			return err
		}
		return r.clusterStatus(nodes, vols, time.Now())
	case "volumes":
		_, vols, err := listAll(ctx, c)
		if err != nil {
			return err
		}
		if len(pos) == 1 {
			i := slices.IndexFunc(vols, func(v v1alpha1.Raid10Volume) bool { return v.Name == pos[0] })
			if i < 0 {
				return fmt.Errorf("unknown volume %q: no Raid10Volume of that name: %w", pos[0], errNotFound)
			}
			vols = vols[i : i+1]
		}
		return r.clusterVolumes(vols, time.Now())
	case "snapshots":
		source := ""
		if len(pos) == 1 {
			source = pos[0]
		}
		snaps, err := listSnapshots(ctx, c, source)
		if err != nil {
			return err
		}
		return r.clusterSnapshots(snaps, time.Now())
	case "disks":
		nodes, _, err := listAll(ctx, c)
		if err != nil {
			return err
		}
		if len(pos) == 1 {
			i := slices.IndexFunc(nodes, func(n v1alpha1.Raid10Node) bool { return n.Name == pos[0] })
			if i < 0 {
				return unknownNode(pos[0], nodes)
			}
			nodes = nodes[i : i+1]
		}
		return r.clusterDisks(nodes)
	case "describe":
		return describeVolume(ctx, c, r, pos[1])
	case "replace-disk":
		last, err := replaceDisk(ctx, c, r, pos[0], pos[1], pos[2], wipe, timeout)
		if err != nil || !follow {
			return err
		}
		return followRebuild(ctx, c, r, last.RebuildingVolumes, timeout)
	}
	return nil
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

// volumeEvents lists the events.k8s.io Events about vol, oldest first.
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

// describedVolume is what describe volume prints with -o json|yaml.
type describedVolume struct {
	Volume    *v1alpha1.Raid10Volume    `json:"volume"`
	Snapshots []v1alpha1.Raid10Snapshot `json:"snapshots"`
	Events    []eventsv1.Event          `json:"events"`
}

// maxEvents is how many recent Events describe shows.
const maxEvents = 20

func describeVolume(ctx context.Context, c client.Client, r renderer, name string) error {
	var v v1alpha1.Raid10Volume
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("unknown volume %q: no Raid10Volume of that name: %w", name, errNotFound)
		}
		return fmt.Errorf("get Raid10Volume %s: %w", name, err)
	}
	evs, err := volumeEvents(ctx, c, "Raid10Volume", v.Name, v.UID)
	if err != nil {
		return err
	}
	snaps, err := listSnapshots(ctx, c, v.Name)
	if err != nil {
		return err
	}
	if snaps == nil {
		snaps = []v1alpha1.Raid10Snapshot{}
	}
	if len(evs) > maxEvents {
		evs = evs[len(evs)-maxEvents:]
	}
	if evs == nil {
		evs = []eventsv1.Event{}
	}
	v.ManagedFields = nil
	if ok, err := r.structured(describedVolume{Volume: &v, Snapshots: snaps, Events: evs}); ok {
		return err
	}
	// The members' disk paths, from the node's Raid10Node (none when it has none).
	paths := map[string]string{}
	var n v1alpha1.Raid10Node
	if err := c.Get(ctx, client.ObjectKey{Name: v.Spec.Node}, &n); err == nil {
		for _, d := range n.Status.Disks {
			paths[d.ID] = d.Path
		}
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get Raid10Node %s: %w", v.Spec.Node, err)
	}
	now := time.Now()
	ew := &errWriter{w: r.w}
	ew.printf("Name:          %s\n", v.Name)
	ew.printf("Node:          %s\n", v.Spec.Node)
	if n := v.Annotations[v1alpha1.PVCNameAnnotation]; n != "" {
		ew.printf("Claim:         %s/%s\n", v.Annotations[v1alpha1.PVCNamespaceAnnotation], n)
	}
	if n := v.Annotations[v1alpha1.PVNameAnnotation]; n != "" {
		ew.printf("Volume:        %s\n", n)
	}
	ew.printf("Age:           %s\n", age(v.CreationTimestamp, now))
	if v.DeletionTimestamp != nil {
		ew.printf("Deleting:      since %s ago\n", age(*v.DeletionTimestamp, now))
	}
	ew.printf("Spec:\n")
	ew.printf("  Size:        %s (%d bytes)\n", human(uint64(v.Spec.SizeBytes)), v.Spec.SizeBytes)
	ew.printf("  Layout:      %d members, %s chunks (near-2)\n", v.Spec.Layout.Members, human(uint64(v.Spec.Layout.ChunkSizeBytes)))
	ew.printf("  Volume mode: %s\n", v.Spec.VolumeMode)
	ew.printf("  FS type:     %s\n", dash(string(v.Spec.FSType)))
	st := v.Status
	ew.printf("Status:\n")
	ew.printf("  Phase:       %s\n", dash(string(st.Phase)))
	ew.printf("  Health:      %s\n", dash(string(st.Health)))
	capacity := "-"
	if st.Capacity != nil {
		capacity = fmt.Sprintf("%s (%d bytes)", human(uint64(st.Capacity.Value())), st.Capacity.Value())
	}
	ew.printf("  Capacity:    %s\n", capacity)
	ew.printf("  In sync:     %s\n", dash(st.InSync))
	ew.printf("  Bad blocks:  %d", st.BadBlocks)
	if st.LostBlocks > 0 {
		ew.printf(", %d lost (bad on every copy: reads there fail until rewritten)", st.LostBlocks)
	}
	ew.printf("\n")
	ew.printf("  Device:      %s\n", dash(st.DevicePath))
	if p := st.Rebuild; p != nil {
		ew.printf("  Rebuild:     member %d %s (%s of %s, %s/s", p.Member, progressBar(p), human(uint64(p.DoneBytes)),
			human(uint64(p.TotalBytes)), human(uint64(p.BytesPerSecond)))
		if p.StartTime != nil {
			ew.printf(", started %s ago", age(*p.StartTime, now))
		}
		ew.printf(")\n")
	}
	if sc := st.Scrub; sc != nil {
		ew.printf("  Scrub:       %s", strings.TrimPrefix(clusterScrubLine(v.Name, sc), v.Name+": "))
		if sc.LastCompletedTime != nil {
			ew.printf(", last completed %s ago", age(*sc.LastCompletedTime, now))
		}
		ew.printf("\n")
	}
	ew.printf("  Message:     %s\n", dash(st.Message))
	ew.printf("  Observed:    generation %d of %d\n", st.ObservedGeneration, v.Generation)
	volumeSnapshotsSection(ew, &v, snaps, now)
	if ew.err != nil {
		return ew.err
	}
	tw := tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	ew = &errWriter{w: tw}
	ew.printf("Members:\n")
	if len(st.Members) == 0 {
		ew.printf("  (none reported)\n")
	} else {
		ew.printf("  INDEX\tDISK\tPATH\tSTATE\tBAD BLOCKS\tTIMEOUTS\tMESSAGE\n")
	}
	for _, m := range st.Members {
		ew.printf("  %d\t%s\t%s\t%s\t%d\t%d\t%s\n", m.Index, dash(m.Disk), dash(paths[m.Disk]), m.State, m.BadBlocks, m.Timeouts, dash(m.Message))
	}
	ew.printf("Conditions:\n")
	if len(st.Conditions) == 0 {
		ew.printf("  (none)\n")
	} else {
		ew.printf("  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE\n")
	}
	for _, cd := range st.Conditions {
		ew.printf("  %s\t%s\t%s\t%s\t%s\n", cd.Type, cd.Status, cd.Reason, age(cd.LastTransitionTime, now), dash(cd.Message))
	}
	ew.printf("Events:\n")
	if len(evs) == 0 {
		ew.printf("  (none)\n")
	} else {
		ew.printf("  TYPE\tREASON\tAGE\tFROM\tMESSAGE\n")
	}
	for _, e := range evs {
		from := e.ReportingController
		if from == "" {
			from = e.DeprecatedSource.Component
		}
		ew.printf("  %s\t%s\t%s\t%s\t%s\n", e.Type, e.Reason, age(metav1.NewTime(eventTime(e)), now), dash(from), e.Note)
	}
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

// replaceDisk asks NODE's agent to replace OLD with NEW (Raid10Node spec.diskReplacement),
// waits for its answer in status.lastDiskReplacement and prints it with the node's
// rebuilding volumes.
func replaceDisk(ctx context.Context, c client.Client, r renderer, node, oldDisk, newPath string, wipe bool, timeout time.Duration) (*v1alpha1.DiskReplacementStatus, error) {
	var n v1alpha1.Raid10Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			var nl v1alpha1.Raid10NodeList
			_ = c.List(ctx, &nl)
			return nil, unknownNode(node, nl.Items)
		}
		return nil, fmt.Errorf("get Raid10Node %s: %w", node, err)
	}
	i := slices.IndexFunc(n.Status.Disks, func(d v1alpha1.DiskStatus) bool { return d.ID == oldDisk || (d.Path != "" && d.Path == oldDisk) })
	if i < 0 {
		var known []string
		for _, d := range n.Status.Disks {
			known = append(known, fmt.Sprintf("%s (%s, %s)", d.ID, dash(d.Path), d.State))
		}
		return nil, fmt.Errorf("unknown disk %q on node %s (its disks: %s): %w", oldDisk, node, strings.Join(known, "; "), errNotFound)
	}
	if d := n.Status.Disks[i]; d.State == v1alpha1.DiskStateHealthy {
		return nil, fmt.Errorf("disk %s (%s) on node %s is Healthy: only a Failed or Missing disk can be replaced", d.ID, dash(d.Path), node)
	}
	if !strings.HasPrefix(newPath, "/") {
		return nil, fmt.Errorf("new disk %q: must be a device path on node %s (/dev/disk/by-id/...)", newPath, node)
	}
	req := v1alpha1.DiskReplacementRequest{OldDisk: oldDisk, NewPath: newPath, Wipe: wipe}
	if cur := n.Spec.DiskReplacement; cur != nil && *cur == req {
		// The same request again (a retry): clear it first so that the new one is a new
		// generation, which the agent acts on.
		if err := c.Patch(ctx, &n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"diskReplacement":null}}`))); err != nil {
			return nil, fmt.Errorf("patch Raid10Node %s: %w", node, err)
		}
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"diskReplacement": req}})
	if err != nil {
		return nil, err
	}
	if err := c.Patch(ctx, &n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return nil, fmt.Errorf("patch Raid10Node %s spec.diskReplacement: %w", node, err)
	}
	gen := n.Generation
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last *v1alpha1.DiskReplacementStatus
	for {
		if err := c.Get(wctx, client.ObjectKey{Name: node}, &n); err == nil {
			if l := n.Status.LastDiskReplacement; l != nil && l.ObservedGeneration >= gen {
				last = l
				break
			}
		} else if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return nil, fmt.Errorf("get Raid10Node %s: %w", node, err)
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("node %s: the agent did not answer the replacement of disk %s within %v (is its node plugin running? the request stays in spec.diskReplacement)", node, oldDisk, timeout)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if ok, err := r.structured(last); ok {
		if err == nil && last.Result != v1alpha1.DiskReplacementSucceeded {
			return nil, fmt.Errorf("node %s refused the replacement: %s", node, last.Message)
		}
		return last, err
	}
	if last.Result != v1alpha1.DiskReplacementSucceeded {
		return nil, fmt.Errorf("node %s refused the replacement of disk %s by %s: %s", node, oldDisk, newPath, last.Message)
	}
	ew := &errWriter{w: r.w}
	ew.printf("node %s: %s\n", node, last.Message)
	if ew.err != nil {
		return nil, ew.err
	}
	var vl v1alpha1.Raid10VolumeList
	if err := c.List(ctx, &vl, client.MatchingFields{"spec.node": node}); err != nil {
		return nil, fmt.Errorf("list Raid10Volumes: %w", err)
	}
	var affected []v1alpha1.Raid10Volume
	for _, v := range vl.Items {
		if slices.Contains(last.RebuildingVolumes, v.Name) {
			affected = append(affected, v)
		}
	}
	if len(affected) == 0 {
		return last, nil
	}
	ew.printf("\n")
	if ew.err != nil {
		return nil, ew.err
	}
	return last, r.clusterVolumes(affected, time.Now())
}

// followRebuild prints a line whenever the health or rebuild progress of one of the named
// volumes changes ("pvc-1: Rebuilding [#####.....] 52% ETA 1m10s"; nothing with -o
// json|yaml) until all are Healthy; it fails when none of them changed for timeout.
func followRebuild(ctx context.Context, c client.Client, r renderer, names []string, timeout time.Duration) error {
	last := map[string]string{}
	deadline := time.Now().Add(timeout)
	for {
		healthy := 0
		var lagging []string
		for _, name := range names {
			var v v1alpha1.Raid10Volume
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
				if apierrors.IsNotFound(err) {
					return fmt.Errorf("volume %s was deleted during its rebuild: %w", name, errNotFound)
				}
				return fmt.Errorf("get Raid10Volume %s: %w", name, err)
			}
			line := fmt.Sprintf("%s: %s %s", name, dash(string(v.Status.Health)), progressBar(v.Status.Rebuild))
			if v.Status.Health == v1alpha1.VolumeHealthHealthy {
				line = fmt.Sprintf("%s: Healthy, %s members in sync", name, v.Status.InSync)
				healthy++
			} else {
				lagging = append(lagging, fmt.Sprintf("%s (%s)", name, dash(string(v.Status.Health))))
			}
			if line != last[name] {
				last[name] = line
				deadline = time.Now().Add(timeout) // progress: the timeout starts again
				if r.o.Output == "table" {
					if _, err := fmt.Fprintln(r.w, line); err != nil {
						return err
					}
				}
			}
		}
		if healthy == len(names) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no rebuild progress for %v: %s", timeout, strings.Join(lagging, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
