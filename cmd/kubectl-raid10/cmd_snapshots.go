package main

// snapshots [VOLUME]: the snapshots (of VOLUME) with their copy progress; in cluster mode as
// kubectl get r10s shows them.

import (
	"context"
	"io"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
)

const snapshotsUsage = "snapshots [VOLUME]"

func clusterSnapshotsCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(clusterFlags(o, "snapshots"), args, 0, 1, snapshotsUsage)
	if err != nil {
		return err
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
		snaps, err := listSnapshots(ctx, c, firstOr(pos, ""))
		if err != nil {
			return err
		}
		return r.clusterSnapshots(snaps, time.Now())
	})
}

func localSnapshotsCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(localFlags(o, "snapshots"), args, 0, 1, snapshotsUsage)
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		return r.localSnapshots(s.Snapshots, firstOr(pos, ""))
	})
}

// firstOr is the first positional argument, or def when there is none.
func firstOr(pos []string, def string) string {
	if len(pos) > 0 {
		return pos[0]
	}
	return def
}
