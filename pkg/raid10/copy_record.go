package raid10

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"
)

// The copy record at a copy target's reserved tail: its states, reading it,
// writing its header and bitmap blocks (the group commit of copied bits), and
// the encoding (docs/on-disk-format.md, "Copy record").

// CopyRecordSize is the number of bytes a copy target reserves at the end of
// its array for the copy record (Array.Reserve).
const CopyRecordSize = 1 << 20

// Copy record layout constants.
const (
	crMagic        = "R10COPY\x00"
	crBlockMagic   = "R10C"
	crVersion      = 1
	crSlot         = 4096
	crBitsOffset   = 16
	crBitsPerBlock = (crSlot - 4 - crBitsOffset) * 8 // 32608
	crMaxBlocks    = (CopyRecordSize - 2*crSlot) / (2 * crSlot)
	crMaxRegions   = crMaxBlocks * crBitsPerBlock
	minCopyRegion  = 4096
	crFlagLive     = 1
	crNameMax      = 64 // source name field, NUL-padded
)

// CopyState is the state a copy record holds.
type CopyState uint32

// Copy states.
const (
	// CopyRunning: regions whose bit is clear still need copying; the hooks
	// must be in place before the source or target serves any I/O.
	CopyRunning CopyState = 1
	// CopyReady: every region was copied; the target is independent.
	CopyReady CopyState = 2
	// CopyFailed: the copy could not go on (the target could not be
	// written); the target does not hold the source's data.
	CopyFailed CopyState = 3
)

func (s CopyState) String() string {
	switch s {
	case CopyRunning:
		return "running"
	case CopyReady:
		return "ready"
	case CopyFailed:
		return "failed"
	}
	return fmt.Sprintf("state-%d", uint32(s))
}

// CopyRecord is the decoded header of a copy record.
type CopyRecord struct {
	State      CopyState
	Live       bool     // the source was cut while served (copy-before-write hook)
	Source     [16]byte // source array UUID
	Target     [16]byte // target array UUID
	Size       int64    // bytes copied from offset 0 of the source
	RegionSize int64
	Regions    int64
	CutAt      time.Time
	// SourceName is the caller's name of the source at the cut (at most 63
	// bytes; the pool's volume or snapshot name), kept for its reports.
	SourceName string
	// SrcGen is the source's copy generation the record is valid for
	// (Live copies; see Array.CopiesResumed).
	SrcGen uint32
	seq    uint64
}

// ReadCopyRecord reads the copy record at the reserved tail of tgt.
func ReadCopyRecord(tgt *Array) (CopyRecord, error) {
	off := tgt.Size()
	if tgt.reserved.Load() < CopyRecordSize {
		return CopyRecord{}, invalidf("copy: the array reserves no copy record")
	}
	b := AlignedBuffer(2 * crSlot)
	if _, err := tgt.read(b, off, true); err != nil {
		return CopyRecord{}, fmt.Errorf("copy: read the record header: %w", err)
	}
	var best *CopyRecord
	magic := false
	for k := range 2 {
		s := b[k*crSlot : (k+1)*crSlot]
		if string(s[:8]) == crMagic {
			magic = true
		}
		r, ok := decodeHeader(s)
		if ok && (best == nil || r.seq > best.seq) {
			best = &r
		}
	}
	switch {
	case best != nil:
		return *best, nil
	case magic:
		return CopyRecord{}, fmt.Errorf("%w: copy record header: both copies fail their checks", ErrCorruptBitmap)
	}
	return CopyRecord{}, ErrNoCopyRecord
}

// bitReq is a copy waiting for its bits to be recorded.
type bitReq struct {
	r, k, n int64
	done    chan error
}

// commit makes the data of regions [r, r+k) durable and records their bits,
// batched with the copies that wait at the same time (group commit): one
// leader flushes the target once for all of them (their data writes
// completed before they queued), then writes each bitmap block they touch
// once.
func (c *Copy) commit(r, k, n int64) error {
	req := bitReq{r: r, k: k, n: n, done: make(chan error, 1)}
	c.pendMu.Lock()
	c.pend = append(c.pend, req)
	if c.leading {
		c.pendMu.Unlock()
		return <-req.done
	}
	c.leading = true
	c.pendMu.Unlock()
	for {
		c.pendMu.Lock()
		batch := c.pend
		c.pend = nil
		if len(batch) == 0 {
			c.leading = false
			c.pendMu.Unlock()
			break
		}
		c.pendMu.Unlock()
		err := c.tgt.Flush()
		if err != nil {
			err = fmt.Errorf("copy: flush the target: %w", err)
		} else {
			err = c.persistBits(batch)
		}
		for _, b := range batch {
			b.done <- err
		}
	}
	return <-req.done
}

// persistBits durably sets the bits of the batch's regions (their data is
// durable): each bitmap block holding some is written into the slot its
// last write did not use, with FUA. A torn write leaves the other slot,
// which lacks only bits whose regions no write has touched yet.
func (c *Copy) persistBits(batch []bitReq) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	blocks := map[int64]bool{}
	for _, q := range batch {
		for x := q.r; x < q.r+q.k; x++ {
			c.image[x/8] |= 1 << (x % 8)
			blocks[x/crBitsPerBlock] = true
		}
	}
	for blk := range blocks {
		seq := c.blockSeq[blk] + 1
		b := c.encodeBlock(blk, seq)
		if _, err := c.tgt.write(opWrite, b, c.recOff+2*crSlot+(2*blk+int64(seq%2))*crSlot, crSlot, true, true); err != nil {
			for _, q := range batch {
				for x := q.r; x < q.r+q.k; x++ {
					if !c.has(x) {
						c.image[x/8] &^= 1 << (x % 8)
					}
				}
			}
			return fmt.Errorf("copy: record the copied regions in bitmap block %d: %w", blk, err)
		}
		c.blockSeq[blk] = seq
	}
	for _, q := range batch {
		for x := q.r; x < q.r+q.k; x++ {
			c.bits[x>>6].Or(1 << (x & 63))
		}
		c.copied.Add(q.n)
	}
	return nil
}

// writeState writes the header with state st into the slot not holding the
// current one, with FUA.
func (c *Copy) writeState(st CopyState) error {
	c.recMu.Lock()
	defer c.recMu.Unlock()
	c.rec.State = st
	return c.writeHeaderLocked()
}

// writeHeaderLocked writes the header as c.rec holds it into the slot not holding the
// current one, with FUA. Caller holds recMu.
func (c *Copy) writeHeaderLocked() error {
	seq := c.rec.seq + 1
	b := c.encodeHeader(seq)
	if _, err := c.tgt.write(opWrite, b, c.recOff+int64(seq%2)*crSlot, crSlot, true, true); err != nil {
		return err
	}
	c.rec.seq = seq
	return nil
}

// Record encoding; see docs/on-disk-format.md ("Copy record").

func (c *Copy) encodeHeader(seq uint64) []byte {
	b := AlignedBuffer(crSlot)
	le := binary.LittleEndian
	copy(b, crMagic)
	le.PutUint32(b[8:], crVersion)
	le.PutUint32(b[12:], uint32(c.rec.State))
	var fl uint32
	if c.rec.Live {
		fl |= crFlagLive
	}
	le.PutUint32(b[16:], fl)
	le.PutUint64(b[24:], seq)
	copy(b[32:], c.rec.Source[:])
	copy(b[48:], c.rec.Target[:])
	le.PutUint64(b[64:], uint64(c.rec.Size))
	le.PutUint64(b[72:], uint64(c.rec.RegionSize))
	le.PutUint64(b[80:], uint64(c.rec.Regions))
	le.PutUint64(b[88:], uint64(c.rec.CutAt.UnixNano()))
	copy(b[96:96+crNameMax], c.rec.SourceName)
	le.PutUint32(b[96+crNameMax:], c.rec.SrcGen)
	le.PutUint32(b[crSlot-4:], crc32.Checksum(b[:crSlot-4], castagnoli))
	return b
}

func decodeHeader(b []byte) (CopyRecord, bool) {
	le := binary.LittleEndian
	if string(b[:8]) != crMagic || le.Uint32(b[crSlot-4:]) != crc32.Checksum(b[:crSlot-4], castagnoli) ||
		le.Uint32(b[8:]) != crVersion {
		return CopyRecord{}, false
	}
	r := CopyRecord{State: CopyState(le.Uint32(b[12:])), seq: le.Uint64(b[24:]),
		Size: int64(le.Uint64(b[64:])), RegionSize: int64(le.Uint64(b[72:])), Regions: int64(le.Uint64(b[80:])),
		CutAt: time.Unix(0, int64(le.Uint64(b[88:]))).UTC()}
	r.SourceName = string(bytes.TrimRight(b[96:96+crNameMax], "\x00"))
	r.SrcGen = le.Uint32(b[96+crNameMax:])
	fl := le.Uint32(b[16:])
	r.Live = fl&crFlagLive != 0
	copy(r.Source[:], b[32:48])
	copy(r.Target[:], b[48:64])
	if fl&^crFlagLive != 0 || r.State < CopyRunning || r.State > CopyFailed || r.Size <= 0 || r.Size%BlockSize != 0 ||
		r.RegionSize < minCopyRegion || r.RegionSize&(r.RegionSize-1) != 0 || r.Regions != (r.Size+r.RegionSize-1)/r.RegionSize ||
		r.Regions > crMaxRegions || !bytes.Equal(b[100+crNameMax:crSlot-4], make([]byte, crSlot-4-100-crNameMax)) {
		return CopyRecord{}, false
	}
	return r, true
}

func (c *Copy) encodeBlock(blk int64, seq uint64) []byte {
	b := AlignedBuffer(crSlot)
	le := binary.LittleEndian
	copy(b, crBlockMagic)
	le.PutUint32(b[4:], uint32(blk))
	le.PutUint64(b[8:], seq)
	copy(b[crBitsOffset:crSlot-4], c.image[blk*crBitsPerBlock/8:(blk+1)*crBitsPerBlock/8])
	le.PutUint32(b[crSlot-4:], crc32.Checksum(b[:crSlot-4], castagnoli))
	return b
}

func decodeBlock(b []byte, blk int64) (seq uint64, bits []byte, ok bool) {
	le := binary.LittleEndian
	if string(b[:4]) != crBlockMagic || le.Uint32(b[4:]) != uint32(blk) ||
		le.Uint32(b[crSlot-4:]) != crc32.Checksum(b[:crSlot-4], castagnoli) {
		return 0, nil, false
	}
	return le.Uint64(b[8:]), b[crBitsOffset : crSlot-4], true
}
