package nbd

import (
	"bytes"
	"io"
	"testing"
)

// TestReplyWriter writes a mix of small and large replies through a replyWriter to a unix
// socket (writev) and to a plain writer, flushing at burst ends, and checks that the peer
// reads every byte in order and that a large reply takes one write with what was pending.
func TestReplyWriter(t *testing.T) {
	type reply struct {
		hdr, payload []byte
		flush        bool
	}
	mk := func(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }
	replies := []reply{
		{mk(16, 1), nil, false},
		{mk(16, 2), mk(4096, 3), false},
		{mk(16, 4), mk(largeReply, 5), false}, // goes out with the two before it
		{mk(16, 6), mk(4096, 7), true},
		{mk(16, 8), mk(1<<20, 9), false},
		{mk(16, 10), mk(200<<10, 11), false}, // small replies that overflow the batch
		{mk(16, 12), mk(60<<10, 13), false},
		{mk(16, 14), mk(60<<10, 15), true},
	}
	var want bytes.Buffer
	for _, r := range replies {
		want.Write(r.hdr)
		want.Write(r.payload)
	}
	t.Run("unix socket", func(t *testing.T) {
		a, b := kernelPair(t)
		defer a.Close()
		defer b.Close()
		got := make(chan []byte)
		go func() {
			buf, _ := io.ReadAll(b)
			got <- buf
		}()
		w := newReplyWriter(a, 128<<10)
		for _, r := range replies {
			if err := w.write(r.hdr, r.payload); err != nil {
				t.Fatal(err)
			}
			if r.flush {
				if err := w.flush(); err != nil {
					t.Fatal(err)
				}
			}
		}
		a.Close()
		if g := <-got; !bytes.Equal(g, want.Bytes()) {
			t.Fatalf("peer read %d bytes, want %d, or they differ", len(g), want.Len())
		}
	})
	t.Run("writes", func(t *testing.T) {
		var rec writeRecorder
		w := newReplyWriter(&rec, 128<<10)
		for _, r := range replies[:3] {
			if err := w.write(r.hdr, r.payload); err != nil {
				t.Fatal(err)
			}
		}
		// net.Buffers.WriteTo falls back to one Write per buffer for a plain writer; what
		// matters is that nothing was written before the large reply and all of it after.
		if !bytes.Equal(rec.all.Bytes(), want.Bytes()[:rec.all.Len()]) || rec.all.Len() != 16+16+4096+16+largeReply {
			t.Fatalf("after the large reply %d bytes written, want %d", rec.all.Len(), 16+16+4096+16+largeReply)
		}
	})
}

type writeRecorder struct {
	all    bytes.Buffer
	writes int
}

func (w *writeRecorder) Write(p []byte) (int, error) {
	w.writes++
	return w.all.Write(p)
}
