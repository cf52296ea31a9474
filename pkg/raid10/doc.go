// Package raid10 is an in-process RAID10 engine with the semantics of Linux
// md raid10 in its default near=2 layout: every chunk has two copies on
// neighbouring members, odd member counts included (see geometry in
// layout.go for the mapping, taken from md's __raid10_find_phys).
//
// # I/O
//
// An Array implements ReadAt, WriteAt, WriteAtFUA, Flush, Discard,
// WriteZeroes, Size, Close and Status for the NBD server and the pool.
// Offsets and lengths are multiples of BlockSize (4096); other requests fail
// with an error that matches syscall.EINVAL. A request is split at chunk
// boundaries. A small read goes to one in-sync copy, the one with fewer
// requests in flight, then the one whose last read ended nearer; a large one
// runs its chunk parts at once and reads an idle chunk's two halves from
// both copies, so one stream reads from every member (readlarge.go). A read
// error is served from the other copy, which is then written over the bad
// one (under the chunk's barrier, so no write races the fix). Writes go to every live copy
// at once and return when all have answered; a member that errors is failed
// (recorded in the other members' superblocks before the write is
// acknowledged) and the write succeeds if an in-sync copy took it and every
// copy that missed it is durably failed. A copy that cannot be failed (the
// last in-sync copy of some chunk) fails the write instead. When both copies
// of a chunk are gone the array is Failed and I/O on that chunk fails with
// an error that matches syscall.EIO.
//
// # The fast path
//
// No lock is taken on the I/O path. A request costs:
//
//   - barrier: one atomic add on the pending counter of its bucket (chunk
//     number mod 1024, one cache line each) and one load of the bucket's
//     barrier counter; a resync, recovery or scrub raises the barrier of the
//     single bucket it is copying and waits for pending to drain. Leaving
//     wakes the raiser only if the barrier is up; a raiser lowering its
//     barrier broadcasts only if some request waits (no wake-ups of empty
//     queues).
//   - bitmap: one atomic add on the region's state word at the start and one
//     at the end. Only the first write into a clean region takes the bitmap
//     mutex, briefly: bits are group-committed by one writer at a time,
//     which holds no lock during the I/O; others wait on a condition.
//   - member selection: atomic loads of the slot state and member pointer;
//     in-flight counters are per member.
//   - writes: when few requests are in flight on members with device
//     latency (moving average >= 20µs), the second copy is handed to a
//     long-lived worker in a preallocated request (a lock-free, ABA-tagged
//     free list; a preallocated completion channel) so both copies are
//     written at once; otherwise (a queue exists already, or the members
//     complete in memory) the submitter writes both in turn, which costs
//     less than the hand-off. No goroutine and no allocation per request.
//   - hand-offs (write copies, member calls under the deadline, parts of a
//     large read): each claims a spare worker with one compare-and-swap,
//     or starts one (never more workers than preallocated requests), so a
//     request never queues behind busy workers, whatever they wait for (a
//     barrier, a member).
//   - buffers: the caller's buffer goes to the members as is; a direct-I/O
//     member bounces a buffer that is not 4 KiB aligned through per-size
//     pools of aligned buffers (AlignedBuffer gives aligned ones).
//
// # The asynchronous path (Queue)
//
// ReadAt and WriteAt block their caller for the member calls. A Queue
// (queue.go) instead takes requests from one submitting goroutine, puts
// their member reads and writes on an io_uring of its own (one
// io_uring_enter per batch), and a reaper goroutine finishes each request
// from its completions: the same barrier, bitmap and acknowledgement rules,
// no goroutine, blocking call or allocation per request. Requests the ring
// cannot take (more than one chunk, FUA, a raised barrier, a copy hook, a
// bad block, a region's first write, a member without a descriptor) run on
// the synchronous path in a goroutine and complete the same way; member
// errors go to the synchronous slow path. Under the member deadline the
// ring uses the queue's own buffers, and a member killed for its deadline
// has its ring copies abandoned (zombies until their completions arrive),
// so their requests complete from the other copy.
//
// # QoS limits
//
// SetLimits (limit.go) caps a volume's read and write requests per second
// and bytes per second, each a token bucket with a burst, 0 unlimited,
// changeable at any time. The hook is one call at the top of ReadAt,
// WriteAt, WriteAtFUA, Discard, WriteZeroes and a Queue's Read and Write;
// the engine's own I/O (resync, recovery, scrub, a copy's reads of its
// source) goes below it and is not counted. Costs: no limits, one atomic
// pointer load; under the limits, a monotonic clock read and one
// compare-and-swap per limited bucket (a GCRA, one word, no lock, no
// allocation). A request over a limit waits, never fails: ReadAt and
// WriteAt sleep in their caller (on a pooled timer); a Queue hands the
// request to a goroutine of its own that waits and then runs it on the
// synchronous path, as a fallback does, so the ring's other requests go on.
// A change wakes the waiting requests, which reserve again under the new
// limits (lifting them releases all at once). Status reports the limits in
// force and counts the delayed requests and their wait. The limits live in
// memory only: the owner applies them again after every Assemble.
// Measured (limit_bench_test.go, a busy 2-vCPU VM): the rate held is
// 0.999-1.009 of the limit for IOPS and bandwidth on both frontends; limits
// far above the load add 50-130 ns per request (1.06x on 4 KiB O_DIRECT
// reads from tmpfs files, 1.3x on memory members), mostly the clock read.
//
// State changes (member failed, recovery done) take Array.metaMu and write
// the superblocks; they never happen on the fast path of a healthy array.
// A failed member stays "failing" (still written to) until its failure is
// durable in the other superblocks, so no write is acknowledged on one copy
// while a crash could still bring the other, stale copy back as in sync.
// The last in-sync copy of a chunk is never failed (as md): the array
// reports Failed and I/O needing it errors, but the metadata stays
// assemblable.
//
// # On-disk format
//
// Every member starts with 8 KiB of superblock, then the write-intent
// bitmap, then the data, all little-endian:
//
//	member offset   size  content
//	0               4096  superblock copy A (written when seq is even)
//	4096            4096  superblock copy B (written when seq is odd)
//	8192            B     bitmap: B/4096 blocks
//	dataOffset      D     data: D/chunk device chunks (dataOffset is 1 MiB aligned)
//
// Superblock (4096 bytes):
//
//	off  size  field
//	0    8     magic "R10SUPER"
//	8    4     version, 2 (1, without bad blocks, is still read)
//	12   4     flags: bit 0 = clean (no resync needed), bit 1 = the
//	           recovery copies dirty regions only
//	16   16    array UUID
//	32   16    member UUID
//	48   4     role: this member's slot, 0..raidDisks-1
//	52   4     raidDisks N (2..256)
//	56   4     layout: near copies, 2
//	60   4     chunk size in bytes (power of two >= 4096)
//	64   8     data offset in bytes
//	72   8     data size per member in bytes (multiple of the chunk size)
//	80   8     array size in bytes
//	88   8     events: bumped by every state change
//	96   8     seq: bumped by every write of this member's superblock
//	104  8     bitmap offset (8192)
//	112  8     bitmap bytes reserved (multiple of 4096)
//	120  8     bitmap region size in bytes (multiple of the chunk size)
//	128  8     events when bitmap bits were last cleared
//	136  8     recovery offset: 2^64-1 = in sync, else the member is stale
//	           and this many data bytes of it are rebuilt (checkpoint)
//	144  8     creation time, Unix nanoseconds
//	152  4     live copies from this array still running (copy.go)
//	156  4     copy generation (see Copies)
//	160  256   slot table: one byte per slot, 0 active, 1 faulty,
//	           2 missing, 3 recovering (only the first N are meaningful)
//	416  4     bad-block runs B (0..229)
//	420  4     reserved, zero
//	424  16*B  runs: u64 first member block, u32 count, u32 zero
//	...        zero
//	4092 4     CRC32C (Castagnoli) of bytes 0..4091
//
// The valid copy (magic, checksum, version and field checks) with the
// higher seq wins, so a torn superblock write loses nothing. Versions other
// than 1 and 2 and unknown flags are rejected; a later version will bump it
// and keep the magic.
//
// # Bad blocks, slow members, interrupted recoveries
//
// Each member's superblock carries its bad-block list (md's bad-block log,
// badblocks.go): blocks whose copy on that member holds no valid data.
// Reads avoid them; a block marked on every copy fails alone with EIO, the
// array stays Degraded. Recovery, resync, scrub and reads retry errors block
// by block (heal.go: syncRange), rewrite a copy that failed from the good
// one, and mark what no copy delivers. A write clears the marks it covers.
// A member with a request older than Options.MemberTimeout is failed and
// the request completes from the other copy (deadline.go), unless it holds
// the last in-sync copy of some chunk or the other copy is late too (half
// the deadline): a slow last copy is waited for, not failed (failing it
// would refuse every later request to it, turning a stall into lost data),
// and so is a stall both copies share (the host's, a shared controller's:
// failing one copy would serve nothing sooner), each counted in
// MemberStatus.SlowLastCopy. A recovery
// checkpoints its progress in the target's superblock and resumes there.
//
// Bitmap block (4096 bytes), block i covering regions 32672*i onwards:
//
//	off  size  field
//	0    4     magic "R10B"
//	4    4     block index i
//	8    4084  bits, region r at byte (r mod 32672)/8, bit r mod 8 (LSB first)
//	4092 4     CRC32C of bytes 0..4091
//
// A block with a bad magic, index or checksum (a torn write) counts as all
// ones: its regions are resynced, never trusted.
//
// # Durability order
//
//   - Write: the region's bit is written to every live member and flushed
//     before the first data write into the region; then the data.
//   - Bit clear (lazy, after two idle sweeps, only while every slot is in
//     sync): flush every member, then write the cleared block. If events
//     moved since the last clear, the superblocks carrying the new
//     events-cleared mark are written (and flushed) first.
//   - Member added (re-add or replacement): the whole bitmap is written to
//     it and flushed before it goes live, and Assemble writes the merged
//     bitmap to every live member, so whichever member is in sync at a
//     later assembly carries every bit.
//   - Superblock: written to every live member, then each is flushed. A
//     member failure is in the superblocks before the write that found it
//     is acknowledged.
//   - Close: flush the members, clear the bitmap (in sync only), write the
//     superblocks with the clean flag.
//   - Grow (online, only while optimal and no sync runs; see Array.Grow):
//     the new range is zeroed on both copies and the members flushed; then,
//     with every barrier bucket drained, the new (clear) bitmap blocks are
//     written and flushed, then the superblocks with the new data size,
//     array size and bitmap bytes are written and flushed; only then does
//     I/O see the new size. Growing only appends rows: no chunk moves.
//
// # Assembly and recovery
//
// Assemble reads every member's superblock, rejects mixtures of arrays,
// disagreeing geometry (except the smaller sizes of a member with fewer
// events, left by a crash during Grow), corrupt superblocks and slots
// claimed twice, and
// takes the member with the highest events as the array's view. Member
// I/O is under the member deadline from the start: a member whose
// superblock read does not answer in time is left out only if the freshest
// view shows every live slot held by members that answered with its event
// count (else Assemble fails with EIO: it might be the only one to know of
// a later failure); one that hangs later is failed as at run time. The
// caller may name witnesses (AssembleOptions.Witnesses: former members
// that may not serve, e.g. on a failed disk): a witness fresher than every
// member gives the view, so a member that missed its writes is stale; when
// that leaves some mirror pair without an in-sync copy, the assembly fails
// and first records each stale member as recovering from its start in the
// member's own superblock (at the witness's events), so that it is refused
// alone later too, even once the witness is gone for good. A member
// with fewer events, a non-active slot entry or an unfinished recovery is
// stale: it is rebuilt, from the dirty bitmap regions only when its events
// are at least the events-cleared mark (nothing it missed can have been
// cleared), else fully. If the freshest superblock is not clean, the
// regions with bits set are resynced (first copy over the second); reads in
// such a region use the first copy until it is done. A write that fails
// marks its region for the same resync; where a chunk there has one copy in
// sync and the other recovering, the resync writes the in-sync copy over
// the recovering one (the write may have reached only that one, in a chunk
// its recovery had passed).
//
// # Copies (snapshots, clones, restores)
//
// A Copy (copy.go) fills a target array with a source array's contents as
// of one instant, the cut. The source's address space is cut into regions
// (16 KiB, doubled until at most 4,129,016 regions); the copy record in the
// target's reserved tail (Array.Reserve(CopyRecordSize): the last 1 MiB of
// the array, outside Size) holds one bit per region, set once that region's
// data as of the cut is durable on the target. Invariant, for every region:
// either its bit is set and the target holds the region as of the cut, or
// the source region is unchanged since the cut.
//
//   - Cut (NewCopy): the record (state running, every bit clear) is written
//     and flushed on the target; then, for a live source, every barrier
//     bucket of the source is drained (freeze) while the copy-before-write
//     hook goes in, and released. A write piece checks the hooks inside its
//     bucket, so every piece admitted after the cut sees the hook and none
//     admitted before is still running. The pause is the drain.
//   - Copy before write: a write, discard or write-zeroes piece touching a
//     region whose bit is clear leaves its bucket, copies the run of
//     uncopied regions it covers (read from the source, written raw to the
//     target), and is admitted again. Concurrent writers of a region wait
//     for its one copy. Durability: the target's data, then the bit.
//     Copies that finish together share one target flush and one write of
//     each bitmap block they touch (group commit).
//   - Hydrate on access: the target's own reads and writes of a region
//     whose bit is clear copy it first, so a cloned volume serves its data
//     at once and a write into it is never overwritten by the copier.
//   - Copier: consecutive uncopied regions, 4 MiB at a time, at the rebuild
//     rate (the target's SyncRateMax, falling back towards SyncRateMin
//     while the source takes writes). When every bit is set the
//     header says ready, the hooks go, and the target is independent.
//   - Costs: without hooks, one atomic load per request piece; with hooks,
//     one bit test per region a piece touches; no lock.
//   - Faults: both arrays are RAID10 and degrade as usual. A source block
//     no copy can read is recorded bad on every copy of the target (EIO
//     there too, never zeroes). A target that cannot be written fails the
//     copy: OnFail (the pool records it in its labels) runs before source
//     writes into uncopied regions go on; target I/O into uncopied regions
//     then fails with EIO. A live copy whose record cannot say failed
//     either moves its source's copy generation on first (as for an absent
//     target, below), so the record, still running, is never resumed.
//   - Crash: ResumeCopy reads the record; a running copy gets its hooks
//     back (the owner calls it before serving either array) and the copier
//     continues from the bits.
//   - Absent target: a live copy is counted in its source's superblocks
//     and its record carries the source's copy generation. After resuming
//     what it found, the owner calls CopiesResumed: if the source counts
//     more running copies than were resumed, the generation moves on, and
//     the absent copy's record is refused (ErrCopyStale) if it returns.
//
// Copy record, at array offset Size() (the reserved tail), little-endian:
//
//	record offset        size  content
//	0                    4096  header slot A
//	4096                 4096  header slot B
//	8192 + 8192*i        4096  bitmap block i, slot A
//	8192 + 8192*i + 4096 4096  bitmap block i, slot B (i < 127)
//
// Header slot:
//
//	off  size  field
//	0    8     magic "R10COPY\0"
//	8    4     version, 1
//	12   4     state: 1 running, 2 ready, 3 failed
//	16   4     flags: bit 0 = the source was live (cut with the hook)
//	20   4     reserved, zero
//	24   8     seq: bumped by every header write; selects the slot (seq mod 2)
//	32   16    source array UUID
//	48   16    target array UUID
//	64   8     size: bytes copied from offset 0 of the source
//	72   8     region size in bytes (a power of two >= 4096)
//	80   8     regions = ceil(size / region size), <= 127 * 32608
//	88   8     cut time, Unix nanoseconds
//	96   64    source name at the cut (the caller's), NUL-padded
//	160  4     the source's copy generation the record is valid for
//	164  3928  zero
//	4092 4     CRC32C of bytes 0..4091
//
// Bitmap block slot (block i covers regions 32608*i onwards):
//
//	off  size  field
//	0    4     magic "R10C"
//	4    4     block index i
//	8    8     seq: bumped by every write of the block; selects the slot
//	16   4076  bits: region r at byte (r mod 32608)/8, bit r mod 8 (LSB first)
//	4092 4     CRC32C of bytes 0..4091
//
// The valid slot with the higher seq wins. NewCopy writes the whole 1 MiB
// (header slot A with seq 1, every block's slot A with seq 0 and no bit);
// a later write goes to the slot the last one did not use, with FUA, so a
// torn write leaves the previous slot, which lacks only bits being set at
// that moment (their source regions are not written yet). A block with
// neither slot valid makes the record unusable (the copy is failed, never
// guessed).
package raid10
