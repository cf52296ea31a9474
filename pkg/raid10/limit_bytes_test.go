package raid10

import "testing"

// TestThrottledBytes: the bytes of the requests the limits delayed are counted per direction
// (ThrottleStatus.ReadBytesDelayed, WriteBytesDelayed), a delayed request's whole size, and a
// delayed discard counts none.
func TestThrottledBytes(t *testing.T) {
	a := limitArray(t)
	// 10 IOPS: a token every 100 ms, so the discard below still finds none left. At 100 IOPS
	// (10 ms) the ReadAt between them took longer than that under -race on a loaded host,
	// and the discard went undelayed.
	if err := a.SetLimits(Limits{WriteIOPS: 10, WriteIOPSBurst: 1}); err != nil {
		t.Fatal(err)
	}
	const size = 16 << 10
	p := make([]byte, size)
	for i := range 6 {
		if _, err := a.WriteAt(p, int64(i*size)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.ReadAt(p, 0); err != nil {
		t.Fatal(err)
	}
	st := a.Status().Throttle
	if st.WritesDelayed == 0 || st.WriteBytesDelayed != st.WritesDelayed*size || st.ReadBytesDelayed != 0 {
		t.Fatalf("after 6 writes of %d bytes under 10 IOPS with a burst of 1: %+v; want the delayed writes' bytes, no read bytes", size, st)
	}
	before := st
	if err := a.Discard(0, size); err != nil {
		t.Fatal(err)
	}
	st = a.Status().Throttle
	if st.WritesDelayed != before.WritesDelayed+1 || st.WriteBytesDelayed != before.WriteBytesDelayed {
		t.Fatalf("a delayed discard: %+v, was %+v; want one more request and no more bytes", st, before)
	}
}
