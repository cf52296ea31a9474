package main

// disks lists the disks (in cluster mode every node's, or one node's); the disk group
// changes this node's pool (local mode): disk fail, disk replace, disk add, disk readd. In a
// cluster a disk is replaced with replace-disk (cmd_replace_disk.go).

import (
	"context"
	"fmt"
	"io"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func clusterDisksCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(clusterFlags(o, "disks"), args, 0, 1, "disks [NODE]")
	if err != nil {
		return err
	}
	return withCluster(o, out, func(c client.Client, r renderer) error {
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
	})
}

func localDisksCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	if _, err := parseArgs(localFlags(o, "disks"), args, 0, 0, "disks"); err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		return r.disks(s.Disks)
	})
}

func diskFailCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(localFlags(o, "disk fail"), args, 1, 1, "disk fail DISK")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		if err := api.FailDisk(ctx, pos[0]); err != nil {
			return err
		}
		return r.done(fmt.Sprintf("disk %s marked failed", pos[0]))
	})
}

func diskReplaceCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := localFlags(o, "disk replace")
	wipe := fs.Bool("wipe", false, "erase a foreign signature on the new disk")
	pos, err := parseArgs(fs, args, 2, 2, "disk replace DISK NEWPATH [--wipe]")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		d, err := api.ReplaceDisk(ctx, pos[0], pool.DiskConfig{Path: pos[1], Wipe: *wipe})
		if err != nil {
			return err
		}
		return r.disks([]pool.DiskInfo{d})
	})
}

func diskAddCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := localFlags(o, "disk add")
	wipe := fs.Bool("wipe", false, "erase a foreign signature on the disk")
	spare := fs.Bool("spare", false, "add as a hot spare")
	pos, err := parseArgs(fs, args, 1, 1, "disk add PATH [--spare] [--wipe]")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		d, err := api.AddDisk(ctx, pool.DiskConfig{Path: pos[0], Wipe: *wipe, Spare: *spare})
		if err != nil {
			return err
		}
		return r.disks([]pool.DiskInfo{d})
	})
}

func diskReaddCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	pos, err := parseArgs(localFlags(o, "disk readd"), args, 1, 1, "disk readd DISK")
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		d, err := api.ReaddDisk(ctx, pos[0])
		if err != nil {
			return err
		}
		return r.disks([]pool.DiskInfo{d})
	})
}
