package kernel

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultMaxRequestKiB is the largest request the attach lets the block layer build for a
// device (Options.MaxRequestKiB): 1 MiB, so that a 1 MiB read or write reaches the server as
// one NBD request. The kernel's nbd driver starts every device at max_sectors_kb 128 (its
// max_hw_sectors_kb is 32768), which cuts a 1 MiB request into 8.
const DefaultMaxRequestKiB = 1024

// sysBlock is where the block devices' queue settings live; a variable for the tests.
var sysBlock = "/sys/block"

// QueueSettings are a device's request queue settings as the kernel reports them after
// TuneQueue.
type QueueSettings struct {
	// MaxSectorsKiB is queue/max_sectors_kb: the largest request the block layer builds.
	MaxSectorsKiB int
	// MaxHWSectorsKiB is queue/max_hw_sectors_kb: the driver's own limit.
	MaxHWSectorsKiB int
	// Scheduler is the I/O scheduler in use ("none" after TuneQueue).
	Scheduler string
}

// TuneQueue sets the request queue of /dev/nbd<index> for the RAID10 engine behind it:
// max_sectors_kb to maxKiB (capped at the driver's max_hw_sectors_kb), so large requests
// arrive whole, and the scheduler to none, as for the NVMe disks below (the engine keeps no
// queue of its own worth sorting for, and mq-deadline costs a lock and a merge pass per
// request). maxKiB <= 0 leaves max_sectors_kb as it is. It returns the settings read back.
// The settings belong to the device, not to its connections: a reconnect keeps them.
func TuneQueue(index uint32, maxKiB int) (QueueSettings, error) {
	q := filepath.Join(sysBlock, fmt.Sprintf("nbd%d", index), "queue")
	var s QueueSettings
	var err error
	if s.MaxHWSectorsKiB, err = readInt(filepath.Join(q, "max_hw_sectors_kb")); err != nil {
		return s, err
	}
	var errs []error
	if maxKiB > 0 {
		want := min(maxKiB, s.MaxHWSectorsKiB)
		if err := writeSys(filepath.Join(q, "max_sectors_kb"), strconv.Itoa(want)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := writeSys(filepath.Join(q, "scheduler"), "none"); err != nil {
		errs = append(errs, err)
	}
	if s.MaxSectorsKiB, err = readInt(filepath.Join(q, "max_sectors_kb")); err != nil {
		errs = append(errs, err)
	}
	if s.Scheduler, err = scheduler(filepath.Join(q, "scheduler")); err != nil {
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}

func readInt(p string) (int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("kernel: read %s: %w", p, err)
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("kernel: %s holds %q, not a number", p, strings.TrimSpace(string(b)))
	}
	return v, nil
}

func writeSys(p, v string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0) // O_TRUNC: sysfs ignores it
	if err != nil {
		return fmt.Errorf("kernel: open %s: %w", p, err)
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("kernel: write %q to %s: %w", v, p, err)
	}
	return nil
}

// scheduler reads queue/scheduler ("mq-deadline kyber [none]") and returns the one in
// brackets.
func scheduler(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("kernel: read %s: %w", p, err)
	}
	for _, f := range strings.Fields(string(b)) {
		if strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") {
			return strings.Trim(f, "[]"), nil
		}
	}
	return strings.TrimSpace(string(b)), nil
}
