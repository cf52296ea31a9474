package main

// create, expand and delete: a volume's life on this node's pool (local mode; in a cluster
// volumes come from PersistentVolumeClaims).

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func createCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := localFlags(o, "create")
	members := fs.Int("members", 0, "member disks (default: every active disk)")
	pos, err := parseArgs(fs, args, 2, 2, "create NAME SIZE [--members N]")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		size, err := parseSize(pos[1])
		if err != nil {
			return err
		}
		v, err := api.CreateVolume(ctx, admin.CreateRequest{Name: pos[0], Size: size, Members: *members})
		if err != nil {
			return err
		}
		return r.volumes([]pool.VolumeInfo{v})
	})
}

func expandCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(localFlags(o, "expand"), args, 2, 2, "expand NAME SIZE")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		size, err := parseSize(pos[1])
		if err != nil {
			return err
		}
		v, err := api.ExpandVolume(ctx, pos[0], size)
		if err != nil {
			return err
		}
		return r.volumes([]pool.VolumeInfo{v})
	})
}

func deleteCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(localFlags(o, "delete"), args, 1, 1, "delete NAME")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		if err := api.DeleteVolume(ctx, pos[0]); err != nil {
			return err
		}
		return r.done(fmt.Sprintf("volume %s deleted", pos[0]))
	})
}

// parseSize reads 10Gi, 512Mi, 4Ki, 1G, 100M, 1T or a byte count.
func parseSize(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	mult := uint64(1)
	num := s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n == 0 || n > (1<<63)/mult {
		return 0, fmt.Errorf("%w: size %q: a positive number with an optional unit (Ki, Mi, Gi, Ti, K, M, G, T)", pool.ErrInvalidArgument, s)
	}
	return n * mult, nil
}
