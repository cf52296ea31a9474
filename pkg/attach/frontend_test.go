package attach

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
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

// TestResolveFrontend: auto is NBD on a kernel without ublk (the test machines' own); ublk
// there is a FailedPrecondition naming /dev/ublk-control. In the VM with ublk it resolves
// (auto there: TestAutoFrontend, and the driver's ublk VM test).
func TestResolveFrontend(t *testing.T) {
	for _, f := range []Frontend{FrontendAuto, "", FrontendNBD} {
		if f != FrontendNBD && ublk.Available() == nil {
			continue // auto follows the kernel's features here
		}
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

// TestAutoFrontend: auto takes ublk exactly where the kernel's ublk_drv has every feature of
// ublk.Required (GET_FEATURES of Debian's 7.3: 0x1fffff), NBD where one is missing (6.12:
// 0x1fe, no UPDATE_SIZE) or there is no ublk to ask; the reason names what decided.
func TestAutoFrontend(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    ublk.Flags
		err  error
		want Frontend
		why  string
	}{
		{"no ublk", 0, ublk.ErrUnavailable, FrontendNBD, "ublk-control"},
		{"6.12", 0x1fe, nil, FrontendNBD, "lacks UPDATE_SIZE"},
		{"no recovery reissue", ublk.Required &^ ublk.FlagUserRecoveryReissue, nil, FrontendNBD, "lacks USER_RECOVERY_REISSUE"},
		{"7.3", 0x1fffff, nil, FrontendUblk, "has USER_RECOVERY|USER_RECOVERY_REISSUE|CMD_IOCTL_ENCODE|UPDATE_SIZE"},
		{"exactly Required", ublk.Required, nil, FrontendUblk, "UPDATE_SIZE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := autoFrontend(tc.f, tc.err)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("autoFrontend(%s, %v) = %q, %q; want %q, a reason with %q", tc.f, tc.err, got, why, tc.want, tc.why)
			}
		})
	}
}

// TestFrontendDescription: a volume's frontend for its status: "nbd", or "ublk" with the
// kernel's reported ublk features when it has any; "" when not attached here.
func TestFrontendDescription(t *testing.T) {
	a := &PoolAttacher{vols: map[string]*served{"n": {}, "u": {ub: &ublk.Device{}}}}
	for _, tc := range []struct {
		feat      ublk.Flags
		vol, want string
	}{
		{0x1fffff, "u", "ublk (SUPPORT_ZERO_COPY, UPDATE_SIZE, AUTO_BUF_REG, PER_IO_DAEMON, BATCH_IO)"},
		{0x1fe, "u", "ublk"},
		{0x1fffff, "n", "nbd"},
		{0x1fffff, "x", ""},
	} {
		a.ublkFeat = tc.feat
		if got := a.Frontend(tc.vol); got != tc.want {
			t.Errorf("features %s: Frontend(%q) = %q, want %q", tc.feat, tc.vol, got, tc.want)
		}
	}
}
