// Package nbd is the data path of a volume: a Network Block Device server that serves a
// blockdev.Backend (the RAID10 engine, or a plain file in tests) over a unix socket, to the
// kernel's nbd driver or to any userspace NBD client.
//
// # Wire format
//
// All integers are big-endian. Only the fixed-newstyle handshake is spoken; the old-style
// handshake, TLS and structured replies are refused (clients fall back to simple replies).
//
//	server greeting (18 bytes)
//	+----------------------+----------------------+-------------+
//	| "NBDMAGIC" (u64)     | "IHAVEOPT" (u64)     | flags (u16) |   FIXED_NEWSTYLE|NO_ZEROES
//	+----------------------+----------------------+-------------+
//	client flags (u32)                                              FIXED_NEWSTYLE[|NO_ZEROES]
//
//	option request (16 + len bytes)          option reply (20 + len bytes)
//	+------------+--------+---------+        +----------------+--------+---------+---------+
//	| IHAVEOPT   | id u32 | len u32 | data   | 0x3e889045565a9| id u32 | typ u32 | len u32 | data
//	+------------+--------+---------+        +----------------+--------+---------+---------+
//
// Options served: GO and INFO (export size, transmission flags, block sizes, name,
// description), LIST, ABORT, EXPORT_NAME (for old clients). Every other option gets
// ERR_UNSUP and the negotiation goes on; malformed option data gets ERR_INVALID; option data
// over 64 KiB gets ERR_TOO_BIG (the data is skipped, never buffered).
//
//	request (28 bytes + payload for WRITE)         simple reply (16 bytes + payload for READ)
//	+----------+-----------+----------+            +----------+-----------+
//	| magic u32| flags u16 | type u16 |            | magic u32| error u32 |
//	+----------+-----------+----------+            +----------+-----------+
//	| handle u64                      |            | handle u64           |
//	+---------------------------------+            +----------------------+
//	| offset u64                      |
//	+----------------------+----------+
//	| length u32           |
//	+----------------------+
//
// # Transmission
//
// Each connection has one reader and a fixed set of workers. The reader decodes a request
// into a preallocated slot (at most Options.MaxInflight slots per connection: when all are
// busy the reader stops reading the socket, which is the back-pressure) and takes a buffer
// from the server-wide BufferPool (bounded by Options.MemoryLimit: when it is exhausted the
// reader waits) and hands it to a worker, unless the request is alone on the connection
// (nothing more buffered, nothing else in flight) and a read or a plain write: that one it
// executes itself, which saves the wake-up of a worker, the largest cost at queue depth 1.
// The reader also executes every read and plain write itself while the backend is
// memory-speed (the moving average of their execution times under 10 us: tmpfs, the page
// cache, the engine over such members): a burst read in one socket read is then served in a
// row on the reader, its replies held back and written in one write when the burst ends (or
// before the reader would wait for a slot or a buffer), since a worker's wake-up costs more
// than such a request. Otherwise, with requests in flight, the workers keep them in parallel,
// as a disk serves a deep queue faster. So that a request executed by the reader, if slow (a hung disk, a read retried on
// the other mirror copy), cannot hold up the requests sent behind it, the reader first marks
// its role free to take: the server's watchdog, which ticks every 2 ms while requests come
// in and stops when they stop, starts a new reader for a connection whose reader has
// executed the same request for a tick or more, and the old reader ends after its reply
// (and its held replies' flush); such a takeover also marks the backend slow, so the next
// requests go to workers until their execution times say otherwise.
// Flushes, FUA writes, trims and zeroes always go to workers.
//
// A backend that is a blockdev.AsyncBackend (the engine, on io_uring) gets one asynchronous
// queue per connection (conn_queue.go): a read or plain write that is not run inline is
// submitted to it by the reader, which goes on reading; the reader hands what it queued to the
// kernel in one call before it waits for anything (the socket, a slot, a buffer) or runs a
// request itself, and the queue's completion moves the slot and writes the reply. Writes wait
// for the workers instead while a fenced write is up (below). Options.SyncOnly turns the queue
// off.
// Whoever executed a request writes its reply (out of order with respect to the requests,
// matched by handle) under the connection's write lock; the last writer of a burst flushes,
// so replies are batched into few writes without a reply ever waiting for a slow request.
// Nothing is allocated per request once the pool is warm.
//
// A client has Options.NegotiationTimeout to finish the handshake.
//
// A failed request gets an error reply (EIO, ENOSPC, EINVAL, EPERM); the connection stays
// up. Only a broken framing (bad request magic, a short read) closes the connection.
//
// Every export advertises FLUSH, FUA, TRIM, WRITE_ZEROES and CAN_MULTI_CONN: all
// connections of an export share one backend, and FLUSH calls its Flush, which makes
// durable every write the backend has completed, whichever connection it came from.
//
// Shutdown stops accepting, stops reading new requests, lets every request in flight finish
// and its reply reach the socket, then closes the connections.
//
// HandOver does the same for a successor process without closing the kernel's sockets: each
// reader stops at the next request boundary (a read in progress is cut by a read deadline and
// the bytes taken of the unfinished request kept), every request read completes and is
// answered, and ServeKernel returns the open socket with the bytes read and not executed
// (Handoff). The next server, given the Handoff, reads those bytes before the socket, so the
// kernel's stream goes on unbroken (the kernel attach passes it between processes).
//
// # Re-sent requests
//
// A client (the kernel's nbd driver) that times a request out shuts that socket down and
// re-sends the request on another connection; the original may still be queued or in the
// backend. Two rules keep the original from landing after a newer write (fence.go):
// a write, trim or zeroing in flight for Options.SlowWrite (1 s, below any request timeout)
// is fenced, and a modifying request that overlaps a fenced one that arrived before it waits
// before it starts; and when the peer is gone (it closed the socket or shut down both
// directions), nothing more of that connection starts: the requests read and not started are
// dropped unanswered, and a reader that waited for a slot or a buffer checks for the hang-up
// (poll) before it hands on what it read. Requests already in the backend finish unanswered
// (orphans, fenced until they finish). The connection ends at once (ServeKernel returns,
// the attach can replace the socket); the orphans finish in the background, and Shutdown
// waits for them. After NBD_CMD_DISC, a drain or a half-close the peer still reads, and every
// request it sent is answered. docs/design.md ("Ordering of re-sent requests") says which
// invariant holds and why.
//
// The kernel attach (generic netlink) lives in the subpackage kernel.
package nbd
