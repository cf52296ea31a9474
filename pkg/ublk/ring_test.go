package ublk

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// TestInGuestRing serves the engine over ublk and checks that its reads and plain writes are
// served on the queue threads' own rings (RingServed: ended inside the thread's Reap, with no
// hand-off), healthy and with a member failed in the middle of a verified fio run: fio sees no
// error and reads back every block it wrote, the device counts no error, and the ring keeps
// serving the degraded array.
func TestInGuestRing(t *testing.T) {
	inGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	arr, d := servedArray(t, ctx, 96<<20, Options{Queues: 2})
	dev := d.Path()

	vm.FioVerify(t, vm.FioJob{Name: "healthy", File: dev, Size: "16M", IODepth: 32})
	st, served := d.Stats(), d.RingServed()
	t.Logf("healthy: %+v, %d ended on the ring", st, served)
	if st.Errors != 0 || served == 0 || served < (st.Reads+st.Writes)/2 {
		t.Fatalf("healthy: %d of %d reads and writes ended on the queue threads' rings, %d errors: want most, no error", served, st.Reads+st.Writes, st.Errors)
	}

	// Member 1 fails while fio writes and verifies a range of its own.
	failed := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		failed <- arr.FailMember(1)
	}()
	vm.FioVerify(t, vm.FioJob{Name: "degraded", File: dev, Size: "16M", IODepth: 32, Extra: []string{"--offset=32M"}})
	if err := <-failed; err != nil {
		t.Fatal(err)
	}
	st2, served2 := d.Stats(), d.RingServed()
	t.Logf("degraded: %+v, %d ended on the ring", st2, served2)
	if st2.Errors != 0 || served2 <= served {
		t.Fatalf("degraded: %d errors, ring served %d then %d: want no error and the ring still serving", st2.Errors, served, served2)
	}
	if s := arr.Status().Members[1]; s.State != raid10.MemberFaulty {
		t.Fatalf("member 1: %+v, want faulty", s)
	}
	vm.Sh(t, "dd", "if="+dev, "of="+filepath.Join(t.TempDir(), "all"), "bs=1M", "count=64", "iflag=direct")
	if err := d.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}
