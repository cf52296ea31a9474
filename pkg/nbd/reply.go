package nbd

import (
	"io"
	"net"
)

// largeReply is the read payload from which a reply is written from the request's own
// buffer (writev) instead of being copied into the batch.
const largeReply = 64 << 10

// replyWriter batches a connection's replies into few system calls. Small replies (headers,
// payloads under largeReply) are copied into buf and written when the writer flushes (the
// last reply of a burst, conn.reply) or buf is full. A large read reply goes out at once,
// with whatever is pending before it, in one writev of the pending bytes, its header and its
// payload: no copy of the payload, one system call. It is used under conn.wmu.
type replyWriter struct {
	w    io.Writer
	buf  []byte
	vec  [3][]byte
	bufs net.Buffers // vec as a slice; a field, so that WriteTo allocates nothing
}

func newReplyWriter(w io.Writer, size int) *replyWriter {
	return &replyWriter{w: w, buf: make([]byte, 0, size)}
}

// write queues (or, for a large payload, writes) one reply: its header and its payload.
func (w *replyWriter) write(hdr, payload []byte) error {
	if len(payload) >= largeReply {
		w.vec = [3][]byte{w.buf, hdr, payload}
		w.bufs = w.vec[:]
		_, err := w.bufs.WriteTo(w.w)
		w.vec = [3][]byte{}
		w.buf = w.buf[:0]
		return err
	}
	if len(w.buf)+len(hdr)+len(payload) > cap(w.buf) {
		if err := w.flush(); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, hdr...)
	w.buf = append(w.buf, payload...)
	return nil
}

// flush writes what is queued.
func (w *replyWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.w.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}
