package main

// replace-disk NODE OLD NEW (cluster mode): sets the Raid10Node's spec.diskReplacement, which
// that node's agent carries out (pool.ReplaceDisk) and answers in
// status.lastDiskReplacement; --follow then prints the rebuild of the affected volumes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

func replaceDiskCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := clusterFlags(o, "replace-disk")
	wipe := fs.Bool("wipe", false, "let the agent erase a foreign signature on the new disk")
	follow := fs.Bool("follow", false, "then follow the rebuild of the affected volumes until they are Healthy")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the node agent's answer (and, with --follow, for each rebuild)")
	pos, err := parseArgs(fs, args, 3, 3, "replace-disk NODE OLD-DISK NEW-PATH [--wipe] [--follow] [--timeout 2m]")
	if err != nil {
		return err
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
		last, err := replaceDisk(ctx, c, r, pos[0], pos[1], pos[2], *wipe, *timeout)
		if err != nil || !*follow {
			return err
		}
		return followRebuild(ctx, c, r, last.RebuildingVolumes, *timeout)
	})
}

// replaceDisk asks NODE's agent to replace OLD with NEW (Raid10Node spec.diskReplacement),
// waits for its answer in status.lastDiskReplacement and prints it with the node's
// rebuilding volumes.
func replaceDisk(ctx context.Context, c client.Client, r renderer, node, oldDisk, newPath string, wipe bool, timeout time.Duration) (*v1alpha1.DiskReplacementStatus, error) {
	n, err := replaceableDisk(ctx, c, node, oldDisk, newPath)
	if err != nil {
		return nil, err
	}
	if err := requestReplacement(ctx, c, n, v1alpha1.DiskReplacementRequest{OldDisk: oldDisk, NewPath: newPath, Wipe: wipe}); err != nil {
		return nil, err
	}
	last, err := awaitReplacement(ctx, c, node, oldDisk, n.Generation, timeout)
	if err != nil {
		return nil, err
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
	return last, printReplacement(ctx, c, r, node, last)
}

// replaceableDisk reads NODE's Raid10Node and checks that OLD (an id or a path) is one of its
// disks, Failed or Missing, and that NEW is a device path.
func replaceableDisk(ctx context.Context, c client.Client, node, oldDisk, newPath string) (*v1alpha1.Raid10Node, error) {
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
	return &n, nil
}

// requestReplacement sets n's spec.diskReplacement to req; n is updated to the patched
// object, whose generation the agent's answer observes.
func requestReplacement(ctx context.Context, c client.Client, n *v1alpha1.Raid10Node, req v1alpha1.DiskReplacementRequest) error {
	if cur := n.Spec.DiskReplacement; cur != nil && *cur == req {
		// The same request again (a retry): clear it first so that the new one is a new
		// generation, which the agent acts on.
		if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"diskReplacement":null}}`))); err != nil {
			return fmt.Errorf("patch Raid10Node %s: %w", n.Name, err)
		}
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"diskReplacement": req}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("patch Raid10Node %s spec.diskReplacement: %w", n.Name, err)
	}
	return nil
}

// awaitReplacement polls NODE's status.lastDiskReplacement until it answers generation gen,
// for at most timeout.
func awaitReplacement(ctx context.Context, c client.Client, node, oldDisk string, gen int64, timeout time.Duration) (*v1alpha1.DiskReplacementStatus, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var n v1alpha1.Raid10Node
		if err := c.Get(wctx, client.ObjectKey{Name: node}, &n); err == nil {
			if l := n.Status.LastDiskReplacement; l != nil && l.ObservedGeneration >= gen {
				return l, nil
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
}

// printReplacement prints the agent's answer and the volumes of NODE that rebuild onto the
// new disk.
func printReplacement(ctx context.Context, c client.Client, r renderer, node string, last *v1alpha1.DiskReplacementStatus) error {
	ew := &errWriter{w: r.w}
	ew.printf("node %s: %s\n", node, last.Message)
	if ew.err != nil {
		return ew.err
	}
	var vl v1alpha1.Raid10VolumeList
	if err := c.List(ctx, &vl, client.MatchingFields{"spec.node": node}); err != nil {
		return fmt.Errorf("list Raid10Volumes: %w", err)
	}
	var affected []v1alpha1.Raid10Volume
	for _, v := range vl.Items {
		if slices.Contains(last.RebuildingVolumes, v.Name) {
			affected = append(affected, v)
		}
	}
	if len(affected) == 0 {
		return nil
	}
	ew.printf("\n")
	if ew.err != nil {
		return ew.err
	}
	return r.clusterVolumes(affected, time.Now())
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
			if v.Status.Health == v1alpha1.VolumeHealthHealthy {
				healthy++
			} else {
				lagging = append(lagging, fmt.Sprintf("%s (%s)", name, dash(string(v.Status.Health))))
			}
			if line := rebuildLine(&v); line != last[name] {
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
