package blockdev

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
