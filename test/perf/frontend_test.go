package perf

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// A frontend serves the engine's array to the guest's kernel as a block device. Every
// registered frontend gets its rows in the table, measured in the same boot as md. To add
// one (ublk), put a file beside this one whose init calls register; nothing else changes.
type frontend struct {
	// name is the target's name in the table ("nbd", "ublk").
	name string
	// order sorts the frontends in the table (nbd is 10).
	order int
	// attach serves arr and returns the device. A frontend the booted kernel cannot
	// serve returns errUnavailable (wrapped, with the reason): its rows then say why.
	attach func(t *testing.T, arr *raid10.Array) (*attached, error)
	// paired, if set, names the rows measured on attached.plain, each case just before
	// the frontend's own run of it: a comparison that the host's load, which changes from
	// minute to minute, cannot skew.
	paired string
}

// attached is one frontend's device while it is measured.
type attached struct {
	dev string
	// plain is the device under dev that the paired rows measure (nbd+crypt: the NBD
	// device under the dm-crypt mapping); "" for none.
	plain string
	// requests counts the requests the frontend has served so far (reads and writes).
	requests func() uint64
	// detach tears the device down; the benchmark closes the array afterwards.
	detach func() error
}

var frontends []frontend

func register(f frontend) {
	frontends = append(frontends, f)
	sort.SliceStable(frontends, func(i, j int) bool { return frontends[i].order < frontends[j].order })
}

func init() { register(frontend{name: "nbd", order: 10, attach: attachNBD}) }

// attachNBD serves the array over the kernel's nbd driver with the node plugin's attach
// (pkg/nbd/kernel: netlink, 2 connections, 1 MiB requests, scheduler none).
func attachNBD(t *testing.T, arr *raid10.Array) (*attached, error) {
	srv, err := nbd.NewServer(nbd.Options{MinBlockSize: raid10.BlockSize}, nbd.Export{Name: "r10", Backend: arr})
	if err != nil {
		return nil, err
	}
	nl, err := kernel.Dial()
	if err != nil {
		srv.Close()
		return nil, err
	}
	st, err := kernel.OpenState(filepath.Join(t.TempDir(), "state.json"))
	if err != nil {
		nl.Close()
		srv.Close()
		return nil, err
	}
	a := kernel.NewAttacher(srv, nl, st, kernel.Options{Connections: 2})
	d, err := a.Attach("perf", "r10")
	if err != nil {
		nl.Close()
		srv.Close()
		return nil, err
	}
	q, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(d.Path()), "queue", "max_sectors_kb"))
	t.Logf("nbd: %s, max_sectors_kb %s", d.Path(), q)
	return &attached{
		dev: d.Path(),
		requests: func() uint64 {
			s, _ := srv.Stats("r10")
			return s.Read.Requests + s.Write.Requests
		},
		detach: func() error {
			err := a.Detach("perf")
			srv.Close()
			nl.Close()
			return err
		},
	}, nil
}
