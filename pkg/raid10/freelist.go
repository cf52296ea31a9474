package raid10

import "sync/atomic"

// reqList is a fixed set of preallocated write hand-off requests on a
// lock-free stack (Treiber), ABA-safe by a tag in the head word: the low 32
// bits are the index of the top entry plus one (0 = empty), the high 32 bits
// count updates. It replaces sync.Pool, whose refill after every GC takes a
// global mutex that 64 submitters would queue on.
type reqList struct {
	head atomic.Uint64
	reqs []wreq
	next []atomic.Uint32 // index+1 of the entry below, 0 = none
}

func newReqList(n int) *reqList {
	l := &reqList{reqs: make([]wreq, n), next: make([]atomic.Uint32, n)}
	for i := range l.reqs {
		l.reqs[i].done = make(chan struct{}, 1)
		l.reqs[i].idx = uint32(i)
		l.push(&l.reqs[i])
	}
	return l
}

// pop returns a free request, or nil when all are in use.
func (l *reqList) pop() *wreq {
	for {
		h := l.head.Load()
		top := uint32(h)
		if top == 0 {
			return nil
		}
		nxt := l.next[top-1].Load()
		if l.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(nxt)) {
			return &l.reqs[top-1]
		}
	}
}

func (l *reqList) push(r *wreq) {
	for {
		h := l.head.Load()
		l.next[r.idx].Store(uint32(h))
		if l.head.CompareAndSwap(h, (h>>32+1)<<32|uint64(r.idx+1)) {
			return
		}
	}
}
