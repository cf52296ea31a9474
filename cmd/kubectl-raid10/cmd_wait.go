package main

// wait NAME (local mode): polls a volume until it has the wanted health, printing its
// rebuild progress.

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

const waitUsage = "wait NAME [--for Healthy] [--timeout 10m]"

func waitCmd(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := localFlags(o, "wait")
	forHealth := fs.String("for", string(pool.Healthy), "health to wait for")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long")
	pos, err := parseArgs(fs, args, 1, 1, waitUsage)
	if err != nil {
		return err
	}
	return withPool(ctx, o, out, func(api admin.API, r renderer) error {
		return waitFor(ctx, api, r, pos[0], pool.Health(*forHealth), *timeout)
	})
}

// waitFor polls a volume until it reaches the wanted health, printing a line whenever its
// health or rebuild progress changes.
func waitFor(ctx context.Context, api admin.API, r renderer, name string, want pool.Health, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		var v *pool.VolumeInfo
		for i := range s.Volumes {
			if s.Volumes[i].Name == name {
				v = &s.Volumes[i]
			}
		}
		if v == nil {
			return fmt.Errorf("%w: volume %q", pool.ErrNotFound, name)
		}
		if line := syncLine(v); line != last {
			if err := r.stream(v, line); err != nil {
				return err
			}
			last = line
		}
		if v.Health == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("volume %s is %s after %s, waited for %s", name, v.Health, timeout, want)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
