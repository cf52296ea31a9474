package main

// volumes [NAME]: the volumes (or one) with their health and rebuild; in cluster mode as
// kubectl get r10v shows them.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func clusterVolumesCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(clusterFlags(o, "volumes"), args, 0, 1, "volumes [NAME]")
	if err != nil {
		return err
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
		_, vols, err := listAll(ctx, c)
		if err != nil {
			return err
		}
		if len(pos) == 1 {
			i := slices.IndexFunc(vols, func(v v1alpha1.Raid10Volume) bool { return v.Name == pos[0] })
			if i < 0 {
				return unknownVolume(pos[0])
			}
			vols = vols[i : i+1]
		}
		return r.clusterVolumes(vols, time.Now())
	})
}

func localVolumesCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(localFlags(o, "volumes"), args, 0, 1, "volumes [NAME]")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		vs := s.Volumes
		if len(pos) == 1 {
			i := slices.IndexFunc(vs, func(v pool.VolumeInfo) bool { return v.Name == pos[0] })
			if i < 0 {
				return fmt.Errorf("%w: volume %q", pool.ErrNotFound, pos[0])
			}
			vs = vs[i : i+1]
		}
		return r.volumes(vs)
	})
}
