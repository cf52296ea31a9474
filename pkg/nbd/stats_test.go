package nbd

import (
	"testing"
	"time"
)

// TestStats checks the per-export counters: requests, errors and bytes by kind, the latency
// buckets adding up to the requests, and the counters of a connection outliving it.
func TestStats(t *testing.T) {
	mem := newMemBackend(1 << 20)
	srv, sock := startServer(t, Options{}, Export{Backend: mem})
	c := dialRaw(t, sock)
	c.goExport("")
	page := make([]byte, 8192)
	c.request(CmdWrite, 0, 1, 0, 8192, page)
	c.request(CmdRead, 0, 2, 4096, 4096, nil)
	c.request(CmdRead, 0, 3, 1<<20, 4096, nil) // past the end: EINVAL
	c.request(CmdFlush, 0, 4, 0, 0, nil)
	c.request(CmdTrim, 0, 5, 0, 65536, nil)
	for range 5 {
		h, errno := c.reply()
		if h == 2 {
			c.read(page[:4096])
		}
		if want := h == 3; (errno != ErrnoNone) != want {
			t.Fatalf("reply %d: errno %d", h, errno)
		}
	}
	check := func(when string) {
		t.Helper()
		st, err := srv.Stats("")
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name                    string
			o                       OpStats
			requests, errors, bytes uint64
		}{
			{"read", st.Read, 2, 1, 4096},
			{"write", st.Write, 1, 0, 8192},
			{"flush", st.Flush, 1, 0, 0},
			{"trim", st.Trim, 1, 0, 65536},
			{"write zeroes", st.WriteZeroes, 0, 0, 0},
		} {
			if tc.o.Requests != tc.requests || tc.o.Errors != tc.errors || tc.o.Bytes != tc.bytes {
				t.Errorf("%s: %s: requests %d errors %d bytes %d, want %d %d %d", when, tc.name,
					tc.o.Requests, tc.o.Errors, tc.o.Bytes, tc.requests, tc.errors, tc.bytes)
			}
			var n uint64
			for _, b := range tc.o.Latency {
				n += b
			}
			if n != tc.o.Requests || tc.o.Requests > 0 && tc.o.LatencySum <= 0 {
				t.Errorf("%s: %s: latency buckets hold %d requests (sum %v), want %d", when, tc.name, n, tc.o.LatencySum, tc.o.Requests)
			}
		}
	}
	check("live connection")
	c.request(CmdDisc, 0, 6, 0, 0, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		srv.mu.Lock()
		n := len(srv.conns)
		srv.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection did not end after NBD_CMD_DISC")
		}
		time.Sleep(10 * time.Millisecond)
	}
	check("ended connection")
	if _, err := srv.Stats("nope"); err == nil {
		t.Error("Stats of an unknown export: no error")
	}
}
