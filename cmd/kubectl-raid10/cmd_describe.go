package main

// describe volume NAME (cluster mode): a volume's spec, status, source and copy, members,
// snapshots, conditions and recent Events, in the manner of kubectl describe.

import (
	"context"
	"fmt"
	"io"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// maxEvents is how many recent Events describe shows.
const maxEvents = 20

func describeCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(clusterFlags(o, "describe"), args, 2, 2, "describe volume NAME")
	if err != nil {
		return err
	}
	if pos[0] != "volume" && pos[0] != "r10v" {
		return fmt.Errorf("describe: unknown kind %q: usage: describe volume NAME", pos[0])
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
		d, err := getDescribedVolume(ctx, c, pos[1])
		if err != nil {
			return err
		}
		if ok, err := r.structured(d); ok {
			return err
		}
		paths, err := diskPaths(ctx, c, d.Volume.Spec.Node)
		if err != nil {
			return err
		}
		return r.describe(d, paths, time.Now())
	})
}

// getDescribedVolume reads the volume called name, its snapshots and its last maxEvents
// Events.
func getDescribedVolume(ctx context.Context, c client.Client, name string) (describedVolume, error) {
	var v v1alpha1.Raid10Volume
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
		if apierrors.IsNotFound(err) {
			return describedVolume{}, unknownVolume(name)
		}
		return describedVolume{}, fmt.Errorf("get Raid10Volume %s: %w", name, err)
	}
	evs, err := volumeEvents(ctx, c, "Raid10Volume", v.Name, v.UID)
	if err != nil {
		return describedVolume{}, err
	}
	snaps, err := listSnapshots(ctx, c, v.Name)
	if err != nil {
		return describedVolume{}, err
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
	return describedVolume{Volume: &v, Snapshots: snaps, Events: evs}, nil
}

// diskPaths are the disk paths of node by disk id, from its Raid10Node (none when it has
// none).
func diskPaths(ctx context.Context, c client.Client, node string) (map[string]string, error) {
	paths := map[string]string{}
	var n v1alpha1.Raid10Node
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		if apierrors.IsNotFound(err) {
			return paths, nil
		}
		return nil, fmt.Errorf("get Raid10Node %s: %w", node, err)
	}
	for _, d := range n.Status.Disks {
		paths[d.ID] = d.Path
	}
	return paths, nil
}
