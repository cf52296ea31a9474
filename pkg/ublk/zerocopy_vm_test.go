package ublk

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestInGuestZeroCopy (in TestUblkNewestVM's boot: 7.3 has UBLK_F_AUTO_BUF_REG) serves the
// engine over a zero-copy ublk device: fio writes and verifies 4 KiB blocks at queue depth
// 32, then mixed sizes up to 1 MiB written O_SYNC with flushes (FUA writes and flushes go
// the copying way, the verifying reads zero-copy, on the same device), then a member fails in the middle of a verified run. fio sees no
// error and reads back what it wrote (sequential writes of 4 KiB to 1 MiB for the mixed
// run, so that none overlaps); ZeroCopyStats proves requests moved with no copy (and
// that the copying way ran too), and the ring keeps serving zero-copy on the degraded array.
func TestInGuestZeroCopy(t *testing.T) {
	inGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if f := checkKernelFeatures(t, ctx); !f.Has(FlagAutoBufReg) {
		t.Fatalf("kernel without AUTO_BUF_REG: %s", f)
	}
	arr, d := servedArray(t, ctx, 96<<20, Options{Queues: 2})
	if !d.ZeroCopy() {
		t.Fatalf("device flags %s: Create did not take zero copy", d.Info().Flags)
	}
	dev := d.Path()
	cs := strings.TrimSpace(vm.Sh(t, "cat", filepath.Join("/sys/block", filepath.Base(dev), "queue", "chunk_sectors")))
	if want := fmt.Sprint(arr.ChunkSize() >> sectorShift); cs != want {
		t.Fatalf("%s: chunk_sectors %s, want the array's chunk, %s sectors", dev, cs, want)
	}

	vm.FioVerify(t, vm.FioJob{Name: "zc-4k", File: dev, Size: "16M", IODepth: 32})
	st, zc := d.Stats(), d.ZeroCopyStats()
	t.Logf("4k: %+v, %+v", st, zc)
	if st.Errors != 0 || zc.ZeroCopied < (st.Reads+st.Writes)/2 {
		t.Fatalf("4k: %d of %d reads and writes zero-copy, %d errors: want most, no error", zc.ZeroCopied, st.Reads+st.Writes, st.Errors)
	}
	vm.FioVerify(t, vm.FioJob{Name: "zc-mixed", File: dev, Size: "16M", IODepth: 16, RW: "write",
		Extra: []string{"--offset=16M", "--bsrange=4k-1M", "--sync=1", "--fsync=8"}})
	st1, zc1 := d.Stats(), d.ZeroCopyStats()
	t.Logf("mixed sizes with flushes: %+v, %+v", st1, zc1)
	if st1.Errors != 0 || zc1.Copied == zc.Copied || zc1.ZeroCopied == zc.ZeroCopied || st1.Flushes == 0 {
		t.Fatalf("mixed: %d errors, %d flushes, copied %d -> %d, zero-copied %d -> %d: want no error, both ways used", st1.Errors, st1.Flushes, zc.Copied, zc1.Copied, zc.ZeroCopied, zc1.ZeroCopied)
	}

	// Member 1 fails while fio writes and verifies a range of its own.
	failed := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		failed <- arr.FailMember(1)
	}()
	vm.FioVerify(t, vm.FioJob{Name: "zc-degraded", File: dev, Size: "16M", IODepth: 32, Extra: []string{"--offset=32M"}})
	if err := <-failed; err != nil {
		t.Fatal(err)
	}
	st2, zc2 := d.Stats(), d.ZeroCopyStats()
	t.Logf("degraded: %+v, %+v", st2, zc2)
	if st2.Errors != 0 || zc2.ZeroCopied <= zc1.ZeroCopied {
		t.Fatalf("degraded: %d errors, zero-copied %d then %d: want no error and zero copy still serving", st2.Errors, zc1.ZeroCopied, zc2.ZeroCopied)
	}
	if s := arr.Status().Members[1]; s.State != raid10.MemberFaulty {
		t.Fatalf("member 1: %+v, want faulty", s)
	}
	if err := d.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	vm.NoKernelWarning(t)
}
