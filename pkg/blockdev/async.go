package blockdev

import "github.com/raid10-csi/raid10-csi/pkg/uring"

// Completer receives the outcome of a request submitted to an AsyncQueue. It is called once
// per request, from a goroutine of the queue's, never from inside Read or Write. Frontends
// implement it on their preallocated request type, so that a submission allocates nothing.
type Completer interface {
	Complete(err error)
}

// AsyncQueue takes requests without blocking its caller: the member I/O is queued, handed to
// the kernel by Submit, and each request's Completer is told when it is done. One goroutine
// owns a queue (it alone calls Read, Write and Submit); completions arrive on others.
type AsyncQueue interface {
	// Read reads len(p) bytes at off into p; p stays untouched by the caller until done.
	Read(p []byte, off int64, done Completer)
	// Write writes p at off (durably with fua); p stays untouched by the caller until done.
	Write(p []byte, off int64, fua bool, done Completer)
	// Submit hands what was queued since the last Submit to the kernel. The owner calls it
	// after a batch, and always before it waits for anything.
	Submit() error
	// Close waits for every request submitted to complete and releases the queue.
	Close() error
}

// AsyncBackend is a Backend that also serves requests through asynchronous queues (the RAID10
// engine on io_uring). A frontend opens one queue per submitting goroutine; where
// NewAsyncQueue fails (no io_uring), it serves through the Backend's blocking methods.
type AsyncBackend interface {
	Backend
	// NewAsyncQueue returns a queue of at most depth requests in flight. idle, when not nil,
	// is called after every completion before the queue waits for more: once per batch of
	// completions found together (and after each completion delivered from elsewhere), so
	// that a frontend holding replies back writes a batch of them in one system call.
	NewAsyncQueue(depth int, idle func()) (AsyncQueue, error)
}

// RingTag is the user_data bit that marks the SQEs of a RingQueue on its owner's ring: the
// owner keeps it clear on its own SQEs and hands every completion that has it to Reap.
const RingTag uint64 = 1 << 63

// RingQueue is an AsyncQueue whose member I/O goes on a ring that its owner drives (a ublk
// queue thread: one ring for the thread's own commands and for the member I/O of its
// requests). It has no goroutine waiting on the ring: the owner submits the ring (Submit does
// nothing; the owner's next io_uring_enter carries what Read and Write prepared), waits on it,
// and passes each completion with RingTag to Reap. A request that ends inside Reap is told on
// the owner's goroutine, through CompleteOnOwner where its Completer is an OwnerCompleter;
// requests that leave the ring (fallbacks, error recovery) are told from other goroutines.
// Read and Write never wait: a request that finds no free state takes the fallback.
type RingQueue interface {
	AsyncQueue
	// Reap takes one completion of the owner's ring whose user_data has RingTag.
	Reap(cqe uring.CQE)
}

// RingBackend is an AsyncBackend whose queues can also run on a caller's ring.
type RingBackend interface {
	AsyncBackend
	// NewRingQueue returns a RingQueue of at most depth requests on ring, which needs room
	// for two SQEs per request besides the owner's. The queue closes the ring in its Close
	// (after the completions of member I/O still in a device, if any).
	NewRingQueue(ring *uring.Ring, depth int) (RingQueue, error)
}

// OwnerCompleter is a Completer that a RingQueue tells on its owner's goroutine, inside Reap,
// when the request ends there: the owner takes the result without a lock or a wake-up.
// Complete is still called for requests that end on any other goroutine.
type OwnerCompleter interface {
	Completer
	// CompleteOnOwner is Complete, called from inside the owner's Reap.
	CompleteOnOwner(err error)
}
