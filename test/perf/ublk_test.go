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

func init() { register(frontend{name: "ublk", order: 20, attach: attachUblk}) }

// attachUblk serves the array over ublk with the node plugin's defaults (pkg/ublk: one queue
// per CPU, 1 MiB requests, scheduler none). A kernel without ublk_drv gives the rows n/a.
func attachUblk(t *testing.T, arr *raid10.Array) (*attached, error) {
	if _, err := os.Stat(ublk.ControlPath); err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, ublk.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := ublk.Create(ctx, arr, ublk.Options{})
	if err != nil {
		return nil, err
	}
	q := func(name string) string {
		b, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(d.Path()), "queue", name))
		return strings.TrimSpace(string(b))
	}
	t.Logf("ublk: %s, %d queues of %d, max_sectors_kb %s, scheduler %s", d.Path(), d.Info().NrHwQueues, d.Info().QueueDepth, q("max_sectors_kb"), q("scheduler"))
	return &attached{
		dev: d.Path(),
		requests: func() uint64 {
			s := d.Stats()
			return s.Reads + s.Writes
		},
		detach: func() error { return d.Delete(context.Background()) },
	}, nil
}
