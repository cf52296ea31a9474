package main

// status: in cluster mode the nodes and the volumes, the ones that need attention first; in
// local mode the pool's capacity, disks, volumes and members.

import (
	"context"
	"io"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
)

func clusterStatusCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	if _, err := parseArgs(clusterFlags(o, "status"), args, 0, 0, "status"); err != nil {
		return err
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
		nodes, vols, err := listAll(ctx, c)
		if err != nil {
			return err
		}
		return r.clusterStatus(nodes, vols, time.Now())
	})
}

func localStatusCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	if _, err := parseArgs(localFlags(o, "status"), args, 0, 0, "status"); err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		return r.status(s)
	})
}
