package attach

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/ublk"
)

func TestParseFrontend(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Frontend
		ok   bool
	}{
		{"", FrontendAuto, true},
		{"auto", FrontendAuto, true},
		{"nbd", FrontendNBD, true},
		{" ublk ", FrontendUblk, true},
		{"UBLK", "", false},
		{"iscsi", "", false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseFrontend(tc.in)
			if tc.ok != (err == nil) || got != tc.want {
				t.Fatalf("ParseFrontend(%q) = %q, %v", tc.in, got, err)
			}
			if err != nil && !errors.Is(err, ErrInvalidFrontend) {
				t.Fatalf("error %v is not ErrInvalidFrontend", err)
			}
		})
	}
}

// TestResolveFrontend: auto is NBD; ublk on a kernel without it (the test machines' own)
// is a FailedPrecondition naming /dev/ublk-control. In the VM with ublk it resolves.
func TestResolveFrontend(t *testing.T) {
	for _, f := range []Frontend{FrontendAuto, "", FrontendNBD} {
		if got, err := ResolveFrontend(f); err != nil || got != FrontendNBD {
			t.Errorf("ResolveFrontend(%q) = %q, %v; want nbd", f, got, err)
		}
	}
	got, err := ResolveFrontend(FrontendUblk)
	if ublk.Available() == nil {
		if err != nil || got != FrontendUblk {
			t.Errorf("ResolveFrontend(ublk) with ublk present = %q, %v", got, err)
		}
		return
	}
	if !errors.Is(err, ErrFrontendUnavailable) || !errors.Is(err, ublk.ErrUnavailable) {
		t.Errorf("ResolveFrontend(ublk) without ublk: %v, want FailedPrecondition naming ublk", err)
	}
}

// TestUblkRecords: the records survive a reopen, deletes stick, and a volume asked for over
// ublk on a node where it is not enabled is refused with FailedPrecondition.
func TestUblkRecords(t *testing.T) {
	p := filepath.Join(t.TempDir(), UblkStateFile)
	r, err := openUblkRecords(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.set("a", 3, true); err != nil {
		t.Fatal(err)
	}
	if err := r.set("b", 7, true); err != nil {
		t.Fatal(err)
	}
	if err := r.set("a", 0, false); err != nil {
		t.Fatal(err)
	}
	r2, err := openUblkRecords(p)
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := r2.get("b"); !ok || id != 7 {
		t.Errorf("b: %d %v, want 7", id, ok)
	}
	if _, ok := r2.get("a"); ok {
		t.Error("a still recorded after its delete")
	}
	if vols := r2.volumes(); len(vols) != 1 || vols[0] != "b" {
		t.Errorf("volumes %v", vols)
	}
	a := &PoolAttacher{vols: map[string]*served{}}
	if _, err := a.AttachFrontend(context.Background(), "v", FrontendUblk); !errors.Is(err, ErrFrontendUnavailable) {
		t.Errorf("ublk attach without EnableUblk: %v, want FailedPrecondition", err)
	}
}
