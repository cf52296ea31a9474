package nbd

import (
	"math/bits"
	"sync"
)

const (
	minBufferShift = 12 // 4 KiB, the smallest buffer handed out
	maxBufferShift = 25 // 32 MiB, the largest request the protocol asks servers to accept
	numClasses     = maxBufferShift - minBufferShift + 1
)

// BufferPool hands out request buffers in power-of-two size classes from 4 KiB to 32 MiB and
// bounds the bytes it has allocated, in use or idle, by a limit. Get blocks while the limit
// is reached and no idle buffer can be reused or dropped: that is the server's memory
// back-pressure. Once warm, Get and Put allocate nothing. One pool is shared by every
// connection of a Server.
type BufferPool struct {
	mu        sync.Mutex
	cond      sync.Cond
	limit     int64
	allocated int64 // bytes in buffers this pool created and has not dropped
	idleBytes int64
	idle      [numClasses][][]byte
	closed    bool
}

// NewBufferPool returns a pool that holds at most limit bytes. limit must be at least the
// largest size that will be asked for.
func NewBufferPool(limit int64) *BufferPool {
	p := &BufferPool{limit: limit}
	p.cond.L = &p.mu
	return p
}

func classOf(n int) int {
	if n <= 1<<minBufferShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufferShift
}

// Get returns a buffer of length n (n <= 32 MiB and <= the limit). It blocks while the pool
// is at its limit; it returns nil if the pool was closed.
func (p *BufferPool) Get(n int) []byte {
	b, _ := p.get(n, nil)
	return b
}

// get is Get, and reports whether it had to wait; beforeWait (if set) runs, without the
// pool's lock, before the first wait.
func (p *BufferPool) get(n int, beforeWait func()) (buf []byte, waited bool) {
	c := classOf(n)
	size := int64(1) << (c + minBufferShift)
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			return nil, waited
		}
		if l := len(p.idle[c]); l > 0 {
			b := p.idle[c][l-1]
			p.idle[c][l-1] = nil
			p.idle[c] = p.idle[c][:l-1]
			p.idleBytes -= size
			return b[:n], waited
		}
		if p.allocated+size <= p.limit {
			p.allocated += size
			return make([]byte, size)[:n], waited
		}
		if p.idleBytes > 0 {
			p.dropIdleLocked(size)
			continue
		}
		if !waited && beforeWait != nil {
			p.mu.Unlock()
			beforeWait()
			p.mu.Lock()
			waited = true
			continue // look again: a buffer may have come back meanwhile
		}
		p.cond.Wait()
		waited = true
	}
}

// dropIdleLocked releases idle buffers of other classes, largest first, until size bytes fit
// under the limit or nothing idle is left.
func (p *BufferPool) dropIdleLocked(size int64) {
	for c := numClasses - 1; c >= 0 && p.allocated+size > p.limit; c-- {
		for len(p.idle[c]) > 0 && p.allocated+size > p.limit {
			l := len(p.idle[c])
			p.idle[c][l-1] = nil
			p.idle[c] = p.idle[c][:l-1]
			s := int64(1) << (c + minBufferShift)
			p.allocated -= s
			p.idleBytes -= s
		}
	}
}

// Put returns a buffer that Get handed out.
func (p *BufferPool) Put(b []byte) {
	if b == nil {
		return
	}
	b = b[:cap(b)]
	c := classOf(len(b))
	p.mu.Lock()
	p.idle[c] = append(p.idle[c], b)
	p.idleBytes += int64(len(b))
	p.mu.Unlock()
	p.cond.Signal()
}

// Close wakes every waiter; Get returns nil from then on.
func (p *BufferPool) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Allocated reports the bytes the pool holds, in use or idle.
func (p *BufferPool) Allocated() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.allocated
}
