package main

// scrub: a check (compare the two copies, count mismatches) or a repair of volumes in the
// background. Local mode starts it through the node's admin socket; cluster mode sets each
// volume's spec.scrub, which the agent of its node carries out and answers in status.scrub.
// --follow prints the progress until every scrub has ended.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

const (
	localScrubUsage   = "scrub VOLUME|--all [--repair] [--follow] [--stop]"
	clusterScrubUsage = "scrub VOLUME|--node NODE [--repair] [--follow] [--timeout 24h]"
)

// answerTimeout is how long cluster mode's `scrub` waits for the node agent to answer a
// request.
const answerTimeout = 2 * time.Minute

// scrubFlags are the flags of `scrub` in both modes.
type scrubFlags struct {
	repair, follow, stop, all bool
	node                      string
	timeout                   time.Duration
}

func (f *scrubFlags) register(fs *flag.FlagSet, cluster bool) {
	fs.BoolVar(&f.repair, "repair", false, "repair: rewrite the second copy of each block whose copies differ (default: check, count only)")
	fs.BoolVar(&f.follow, "follow", false, "print the progress until the scrub ends")
	fs.DurationVar(&f.timeout, "timeout", 24*time.Hour, "with --follow: give up after this long")
	if cluster {
		fs.StringVar(&f.node, "node", "", "scrub every volume of this node")
	} else {
		fs.BoolVar(&f.all, "all", false, "scrub every volume of this node")
		fs.BoolVar(&f.stop, "stop", false, "pause the running scrub instead (a later scrub of the same kind continues it where the engine can)")
	}
}

// localScrubCmd is `scrub VOLUME|--all [--repair] [--follow] [--stop]` through the node's
// admin socket (or the pool opened here, when nothing runs: then --follow is implied, since
// the scrub ends with this process).
func localScrubCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := localFlags(o, "scrub")
	var f scrubFlags
	f.register(fs, false)
	pos, err := parseArgs(fs, args, 0, 1, localScrubUsage)
	if err != nil {
		return err
	}
	if (len(pos) == 1) == f.all {
		return fmt.Errorf("usage: %s: name one volume or --all", localScrubUsage)
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		if _, direct := api.(admin.Direct); direct {
			f.follow = true
		}
		names, err := localScrubNames(ctx, api, pos, f.all)
		if err != nil {
			return err
		}
		for _, name := range names {
			sc, err := f.startOrStop(ctx, api, name)
			if err != nil {
				return fmt.Errorf("volume %s: %w", name, err)
			}
			if !f.follow {
				if err := printScrub(r, name, sc); err != nil {
					return err
				}
			}
		}
		if !f.follow || f.stop {
			return nil
		}
		return followScrubs(ctx, r, names, f.timeout, func(ctx context.Context) ([]pool.VolumeInfo, error) {
			s, err := api.Status(ctx)
			return s.Volumes, err
		})
	})
}

// startOrStop starts a local scrub of the kind the flags ask for, or with --stop pauses the
// running one.
func (f *scrubFlags) startOrStop(ctx context.Context, api admin.API, name string) (pool.ScrubInfo, error) {
	if f.stop {
		return api.StopScrub(ctx, name)
	}
	kind := pool.ScrubCheck
	if f.repair {
		kind = pool.ScrubRepair
	}
	return api.StartScrub(ctx, name, kind)
}

// localScrubNames are the volumes to scrub: the one named, or with --all every volume.
func localScrubNames(ctx context.Context, api admin.API, pos []string, all bool) ([]string, error) {
	if !all {
		return pos, nil
	}
	s, err := api.Status(ctx)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, v := range s.Volumes {
		names = append(names, v.Name)
	}
	return names, nil
}

// printScrub prints a local scrub's state.
func printScrub(r renderer, name string, sc pool.ScrubInfo) error {
	return r.stream(map[string]any{"volume": name, "scrub": sc}, scrubLine(name, sc))
}

// followScrubs polls the volumes' scrubs, printing a line whenever one changes, until none
// runs. It fails when a scrub failed or the timeout passed.
func followScrubs(ctx context.Context, r renderer, names []string, timeout time.Duration, list func(context.Context) ([]pool.VolumeInfo, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := map[string]string{}
	for {
		vols, err := list(ctx)
		if err != nil {
			return err
		}
		running, failed := false, ""
		for _, name := range names {
			var sc *pool.ScrubInfo
			for i := range vols {
				if vols[i].Name == name {
					sc = vols[i].Scrub
				}
			}
			if sc == nil {
				continue
			}
			key := scrubLine(name, *sc)
			if sc.State == pool.ScrubRunning {
				running = true
				key = fmt.Sprintf("%s: %s %s %3.0f%%", name, sc.Kind, sc.State, sc.Percent) // a line per whole percent
			}
			if key != last[name] {
				if err := printScrub(r, name, *sc); err != nil {
					return err
				}
				last[name] = key
			}
			if sc.State == pool.ScrubFailed {
				failed = name
			}
		}
		if !running {
			if failed != "" {
				return fmt.Errorf("scrub of volume %s failed", failed)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("scrub still running after %s", timeout)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// clusterScrubCmd is `kubectl raid10 scrub VOLUME|--node NODE [--repair] [--follow]`: it
// sets each volume's spec.scrub to a new request, which the agent of the volume's node
// carries out and answers in status.scrub; --follow prints the progress until every scrub
// has ended.
func clusterScrubCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := clusterFlags(o, "scrub")
	var f scrubFlags
	f.register(fs, true)
	pos, err := parseArgs(fs, args, 0, 1, clusterScrubUsage)
	if err != nil {
		return err
	}
	if (len(pos) == 1) == (f.node != "") {
		return fmt.Errorf("usage: %s: name one volume or --node", clusterScrubUsage)
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
		names := pos
		if f.node != "" {
			if names, err = nodeVolumes(ctx, c, f.node); err != nil {
				return err
			}
		}
		kind := v1alpha1.ScrubKindCheck
		if f.repair {
			kind = v1alpha1.ScrubKindRepair
		}
		id := time.Now().UTC().Format(time.RFC3339Nano)
		if err := requestScrubs(ctx, c, names, v1alpha1.ScrubRequest{Kind: kind, Request: id}); err != nil {
			return err
		}
		return followClusterScrubs(ctx, c, r, names, id, f.follow, f.timeout)
	})
}

// nodeVolumes are the names of node's volumes; it fails when there are none.
func nodeVolumes(ctx context.Context, c client.Client, node string) ([]string, error) {
	nodes, vols, err := listAll(ctx, c)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, v := range vols {
		if v.Spec.Node == node {
			names = append(names, v.Name)
		}
	}
	if len(names) == 0 {
		if !slices.ContainsFunc(nodes, func(n v1alpha1.Raid10Node) bool { return n.Name == node }) {
			return nil, unknownNode(node, nodes)
		}
		return nil, fmt.Errorf("node %s has no volumes: %w", node, errNotFound)
	}
	return names, nil
}

// requestScrubs sets the named volumes' spec.scrub to req.
func requestScrubs(ctx context.Context, c client.Client, names []string, req v1alpha1.ScrubRequest) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"scrub": req}})
	if err != nil {
		return err
	}
	for _, name := range names {
		v := &v1alpha1.Raid10Volume{}
		v.Name = name
		if err := c.Patch(ctx, v, client.RawPatch(types.MergePatchType, patch)); err != nil {
			if apierrors.IsNotFound(err) {
				return unknownVolume(name)
			}
			return fmt.Errorf("patch Raid10Volume %s spec.scrub: %w", name, err)
		}
	}
	return nil
}

// followClusterScrubs waits until the agents answered request id on every volume, printing
// each answer; with follow, until every scrub has ended, printing a line per change. It
// fails when a scrub failed or could not start.
func followClusterScrubs(ctx context.Context, c client.Client, r renderer, names []string, id string, follow bool, timeout time.Duration) error {
	last := map[string]string{}
	deadline := time.Now().Add(answerTimeout)
	if follow {
		deadline = time.Now().Add(timeout)
	}
	for {
		pending, failed := 0, []string{}
		for _, name := range names {
			var v v1alpha1.Raid10Volume
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
				return fmt.Errorf("get Raid10Volume %s: %w", name, err)
			}
			sc := v.Status.Scrub
			if sc == nil || sc.Request != id {
				pending++
				continue
			}
			if sc.State == v1alpha1.ScrubStateRunning && follow {
				pending++
			}
			if sc.State == v1alpha1.ScrubStateFailed {
				failed = append(failed, fmt.Sprintf("%s: %s", name, sc.Message))
			}
			if line := clusterScrubLine(name, sc); line != last[name] {
				last[name] = line
				if err := r.stream(map[string]any{"volume": name, "scrub": sc}, line); err != nil {
					return err
				}
			}
		}
		if pending == 0 {
			if len(failed) > 0 {
				return fmt.Errorf("scrub failed: %s", strings.Join(failed, "; "))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d scrubs not answered or not finished in time (is the node agent running?)", pending, len(names))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
