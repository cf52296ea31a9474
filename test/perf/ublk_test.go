package perf

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

func init() {
	register(frontend{name: "ublk", order: 20, attach: func(t *testing.T, arr *raid10.Array) (*attached, error) {
		return attachUblk(t, arr, ublk.Options{})
	}})
	register(frontend{name: "ublk-copy", order: 21, attach: attachUblkCopy})
}

// attachUblkCopy is ublk with zero copy left out (Options.NoZeroCopy), beside the zero-copy
// rows on a kernel that has it (UBLK_F_AUTO_BUF_REG, 6.16+); elsewhere the ublk rows are
// already the copying path, and these are n/a.
func attachUblkCopy(t *testing.T, arr *raid10.Array) (*attached, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := ublk.Features(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	if !f.Has(ublk.FlagAutoBufReg) {
		return nil, fmt.Errorf("%w: no zero copy to leave out here (features %s)", errUnavailable, f)
	}
	return attachUblk(t, arr, ublk.Options{NoZeroCopy: true})
}

// attachUblk serves the array over ublk with the node plugin's defaults (pkg/ublk: one queue
// per CPU, 1 MiB requests, scheduler none, zero copy where the kernel has it) and opts. A
// kernel without ublk_drv gives the rows n/a.
func attachUblk(t *testing.T, arr *raid10.Array, opts ublk.Options) (*attached, error) {
	if _, err := os.Stat(ublk.ControlPath); err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, ublk.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := ublk.Create(ctx, arr, opts)
	if err != nil {
		return nil, err
	}
	q := func(name string) string {
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(d.Path()), "queue", name))
		return strings.TrimSpace(string(b))
	}
	t.Logf("ublk: %s, %d queues of %d, max_sectors_kb %s, scheduler %s, zero copy %v", d.Path(), d.Info().NrHwQueues, d.Info().QueueDepth, q("max_sectors_kb"), q("scheduler"), d.ZeroCopy())

	return &attached{
		dev: d.Path(),
		requests: func() uint64 {
			s := d.Stats()
			return s.Reads + s.Writes
		},
		detach: func() error {
			if d.ZeroCopy() {
				t.Logf("ublk zero copy: %+v", d.ZeroCopyStats())
			}
			return d.Delete(context.Background())
		},
	}, nil
}
