package main

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

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// answerTimeout is how long `scrub` waits for the node agent to answer a request.
const answerTimeout = 2 * time.Minute

// runClusterScrub is `kubectl raid10 scrub VOLUME|--node NODE [--repair] [--follow]`: it
// sets each volume's spec.scrub to a new request, which the agent of the volume's node
// carries out and answers in status.scrub; --follow prints the progress until every scrub
// has ended.
func runClusterScrub(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("scrub", flag.ContinueOnError)
	fs.StringVar(&o.Output, "o", o.Output, "output format: table, json or yaml")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context")
	var f scrubFlags
	f.register(fs, true)
	const usage = "scrub VOLUME|--node NODE [--repair] [--follow] [--timeout 24h]"
	pos, err := parseArgs(fs, args, 0, 1, usage)
	if err != nil {
		return err
	}
	if (len(pos) == 1) == (f.node != "") {
		return fmt.Errorf("usage: %s: name one volume or --node", usage)
	}
	if err := o.Validate(); err != nil {
		return err
	}
	c, err := clusterClient(o)
	if err != nil {
		return err
	}
	var names []string
	if f.node != "" {
		nodes, vols, err := listAll(ctx, c)
		if err != nil {
			return err
		}
		for _, v := range vols {
			if v.Spec.Node == f.node {
				names = append(names, v.Name)
			}
		}
		if len(names) == 0 {
			if !slices.ContainsFunc(nodes, func(n v1alpha1.Raid10Node) bool { return n.Name == f.node }) {
				return unknownNode(f.node, nodes)
			}
			return fmt.Errorf("node %s has no volumes: %w", f.node, errNotFound)
		}
	} else {
		names = pos
	}
	kind := v1alpha1.ScrubKindCheck
	if f.repair {
		kind = v1alpha1.ScrubKindRepair
	}
	id := time.Now().UTC().Format(time.RFC3339Nano)
	for _, name := range names {
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"scrub": v1alpha1.ScrubRequest{Kind: kind, Request: id}}})
		if err != nil {
			return err
		}
		v := &v1alpha1.Raid10Volume{}
		v.Name = name
		if err := c.Patch(ctx, v, client.RawPatch(types.MergePatchType, patch)); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("unknown volume %q: no Raid10Volume of that name: %w", name, errNotFound)
			}
			return fmt.Errorf("patch Raid10Volume %s spec.scrub: %w", name, err)
		}
	}
	r := renderer{o: o, w: out}
	return followClusterScrubs(ctx, c, r, names, id, f.follow, f.timeout)
}

// clusterScrubLine is one line of a volume's scrub status.
func clusterScrubLine(name string, sc *v1alpha1.ScrubStatus) string {
	line := fmt.Sprintf("%s: %s %s %d%% (%s of %s", name, sc.Kind, sc.State, sc.Percent, human(uint64(sc.DoneBytes)), human(uint64(sc.TotalBytes)))
	if sc.State == v1alpha1.ScrubStateRunning && sc.BytesPerSecond > 0 {
		line += fmt.Sprintf(", %s/s", human(uint64(sc.BytesPerSecond)))
		if sc.ETASeconds != nil {
			line += fmt.Sprintf(", ETA %s", time.Duration(*sc.ETASeconds)*time.Second)
		}
	}
	line += fmt.Sprintf("), %d mismatches", sc.Mismatches)
	if sc.Kind == v1alpha1.ScrubKindRepair {
		line += fmt.Sprintf(", %d repaired", sc.Repaired)
	}
	if sc.Lost > 0 {
		line += fmt.Sprintf(", %d lost", sc.Lost)
	}
	if sc.Message != "" {
		line += ": " + sc.Message
	}
	return line
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
			line := clusterScrubLine(name, sc)
			if line == last[name] {
				continue
			}
			last[name] = line
			var err error
			switch r.o.Output {
			case "json":
				err = json.NewEncoder(r.w).Encode(map[string]any{"volume": name, "scrub": sc})
			case "yaml":
				if _, err = fmt.Fprintln(r.w, "---"); err == nil {
					_, err = r.structured(map[string]any{"volume": name, "scrub": sc})
				}
			default:
				_, err = fmt.Fprintln(r.w, line)
			}
			if err != nil {
				return err
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
