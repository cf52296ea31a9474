package raid10

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"k8s.io/klog/v2"
)

// On-disk constants. The layout is documented in doc.go and
// docs/on-disk-format.md; keep the three in step.
const (
	sbMagic        = "R10SUPER"
	sbVersion      = 2 // written; version 1 (no bad-block list) is still read
	sbSize         = 4096
	sbCopyA        = 0    // member offset of superblock copy A
	sbCopyB        = 4096 // member offset of superblock copy B
	bitmapOffset   = 8192 // member offset of the write-intent bitmap
	sbCRCOffset    = sbSize - 4
	sbSlotsOffset  = 160
	nearCopies     = 2
	sbFlagClean    = 1 << 0
	sbFlagPartial  = 1 << 1 // the recovery in progress copies dirty bitmap regions only
	sbBadCount     = 416    // u32 number of bad-block runs
	sbBadEntries   = 424    // first run: u64 start block, u32 count, u32 zero
	sbBadEntrySize = 16
	recoveryDone   = math.MaxUint64
	dataAlign      = 1 << 20 // data offset alignment
	bmMagic        = "R10B"
	bmHeader       = 8
	bmBitsPerBlock = (sbSize - bmHeader - 4) * 8
)

// MaxMembers is the most members an array can have: the size of the slot
// table in the superblock.
const MaxMembers = 256

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// slotState is the persisted state of a slot, one byte per slot in the
// superblock's slot table.
type slotState uint8

const (
	slotActive     slotState = 0 // in sync
	slotFaulty     slotState = 1 // failed; its data is stale
	slotMissing    slotState = 2 // never assembled / removed
	slotRecovering slotState = 3 // being rebuilt; stale until recovery ends
)

// superblock is the decoded form of one superblock copy.
type superblock struct {
	clean         bool
	arrayUUID     [16]byte
	memberUUID    [16]byte
	role          uint32
	raidDisks     uint32
	layout        uint32 // near copies, always 2
	chunkSize     uint32
	dataOffset    uint64
	dataSize      uint64
	arraySize     uint64
	events        uint64
	seq           uint64
	bitmapOffset  uint64
	bitmapBytes   uint64
	regionSize    uint64
	eventsCleared uint64
	recoveryOff   uint64 // member data bytes rebuilt, or recoveryDone
	partial       bool   // the recovery copies dirty regions only
	ctime         uint64
	liveCopies    uint32 // live copies (snapshots, clones) from this array still running
	copyGen       uint32 // bumped when the array is served without some running copy's hook
	slots         [MaxMembers]slotState
	bad           []badRange // this member's bad blocks (version 2)
}

func (sb *superblock) marshal(b []byte) {
	clear(b[:sbSize])
	copy(b[0:8], sbMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], sbVersion)
	var flags uint32
	if sb.clean {
		flags |= sbFlagClean
	}
	if sb.partial {
		flags |= sbFlagPartial
	}
	le.PutUint32(b[12:], flags)
	copy(b[16:32], sb.arrayUUID[:])
	copy(b[32:48], sb.memberUUID[:])
	le.PutUint32(b[48:], sb.role)
	le.PutUint32(b[52:], sb.raidDisks)
	le.PutUint32(b[56:], sb.layout)
	le.PutUint32(b[60:], sb.chunkSize)
	le.PutUint64(b[64:], sb.dataOffset)
	le.PutUint64(b[72:], sb.dataSize)
	le.PutUint64(b[80:], sb.arraySize)
	le.PutUint64(b[88:], sb.events)
	le.PutUint64(b[96:], sb.seq)
	le.PutUint64(b[104:], sb.bitmapOffset)
	le.PutUint64(b[112:], sb.bitmapBytes)
	le.PutUint64(b[120:], sb.regionSize)
	le.PutUint64(b[128:], sb.eventsCleared)
	le.PutUint64(b[136:], sb.recoveryOff)
	le.PutUint64(b[144:], sb.ctime)
	le.PutUint32(b[152:], sb.liveCopies)
	le.PutUint32(b[156:], sb.copyGen)
	for i := 0; i < int(sb.raidDisks) && i < MaxMembers; i++ {
		b[sbSlotsOffset+i] = byte(sb.slots[i])
	}
	le.PutUint32(b[sbBadCount:], uint32(len(sb.bad)))
	for i, r := range sb.bad {
		e := b[sbBadEntries+i*sbBadEntrySize:]
		le.PutUint64(e, uint64(r.start))
		le.PutUint32(e[8:], uint32(r.count))
	}
	le.PutUint32(b[sbCRCOffset:], crc32.Checksum(b[:sbCRCOffset], castagnoli))
}

// unmarshalSuperblock decodes and validates one copy. It returns
// ErrNoSuperblock when the magic is absent and ErrCorruptSuperblock (wrapped
// with the reason) for anything else wrong. It never panics.
func unmarshalSuperblock(b []byte) (*superblock, error) {
	if len(b) < sbSize || !bytes.Equal(b[0:8], []byte(sbMagic)) {
		return nil, ErrNoSuperblock
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[sbCRCOffset:]), crc32.Checksum(b[:sbCRCOffset], castagnoli); got != want {
		return nil, fmt.Errorf("%w: checksum %#08x, want %#08x", ErrCorruptSuperblock, got, want)
	}
	version := le.Uint32(b[8:])
	if version != 1 && version != sbVersion {
		return nil, fmt.Errorf("%w: unsupported version %d", ErrCorruptSuperblock, version)
	}
	flags := le.Uint32(b[12:])
	if flags&^(sbFlagClean|sbFlagPartial) != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", ErrCorruptSuperblock, flags)
	}
	sb := &superblock{
		clean:         flags&sbFlagClean != 0,
		partial:       flags&sbFlagPartial != 0,
		role:          le.Uint32(b[48:]),
		raidDisks:     le.Uint32(b[52:]),
		layout:        le.Uint32(b[56:]),
		chunkSize:     le.Uint32(b[60:]),
		dataOffset:    le.Uint64(b[64:]),
		dataSize:      le.Uint64(b[72:]),
		arraySize:     le.Uint64(b[80:]),
		events:        le.Uint64(b[88:]),
		seq:           le.Uint64(b[96:]),
		bitmapOffset:  le.Uint64(b[104:]),
		bitmapBytes:   le.Uint64(b[112:]),
		regionSize:    le.Uint64(b[120:]),
		eventsCleared: le.Uint64(b[128:]),
		recoveryOff:   le.Uint64(b[136:]),
		ctime:         le.Uint64(b[144:]),
		liveCopies:    le.Uint32(b[152:]),
		copyGen:       le.Uint32(b[156:]),
	}
	copy(sb.arrayUUID[:], b[16:32])
	copy(sb.memberUUID[:], b[32:48])
	if sb.raidDisks < 2 || sb.raidDisks > MaxMembers {
		return nil, fmt.Errorf("%w: %d raid disks", ErrCorruptSuperblock, sb.raidDisks)
	}
	for i := 0; i < int(sb.raidDisks); i++ {
		s := slotState(b[sbSlotsOffset+i])
		if s > slotRecovering {
			return nil, fmt.Errorf("%w: slot %d state %d", ErrCorruptSuperblock, i, s)
		}
		sb.slots[i] = s
	}
	if version >= 2 {
		n := le.Uint32(b[sbBadCount:])
		if n > maxBadRanges {
			return nil, fmt.Errorf("%w: %d bad-block runs, at most %d", ErrCorruptSuperblock, n, maxBadRanges)
		}
		for i := 0; i < int(n); i++ {
			e := b[sbBadEntries+i*sbBadEntrySize:]
			r := badRange{start: int64(le.Uint64(e) & (1<<56 - 1)), count: int64(le.Uint32(e[8:]))}
			if le.Uint64(e)>>56 != 0 || le.Uint32(e[12:]) != 0 || r.count == 0 {
				return nil, fmt.Errorf("%w: bad-block run %d", ErrCorruptSuperblock, i)
			}
			if i > 0 {
				if p := sb.bad[i-1]; r.start <= p.start+p.count {
					return nil, fmt.Errorf("%w: bad-block run %d not after run %d", ErrCorruptSuperblock, i, i-1)
				}
			}
			sb.bad = append(sb.bad, r)
		}
	}
	if err := sb.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorruptSuperblock, err)
	}
	return sb, nil
}

func (sb *superblock) validate() error {
	switch {
	case sb.layout != nearCopies:
		return fmt.Errorf("layout %d, only near=2 is supported", sb.layout)
	case sb.role >= sb.raidDisks:
		return fmt.Errorf("role %d of %d", sb.role, sb.raidDisks)
	case sb.chunkSize < BlockSize || sb.chunkSize&(sb.chunkSize-1) != 0:
		return fmt.Errorf("chunk size %d", sb.chunkSize)
	case sb.regionSize == 0 || sb.regionSize%uint64(sb.chunkSize) != 0 || sb.regionSize > 1<<40:
		return fmt.Errorf("region size %d", sb.regionSize)
	case sb.bitmapOffset != bitmapOffset || sb.bitmapBytes%sbSize != 0 || sb.bitmapBytes > 1<<30:
		return fmt.Errorf("bitmap at %d, %d bytes", sb.bitmapOffset, sb.bitmapBytes)
	case sb.dataOffset < sb.bitmapOffset+sb.bitmapBytes || sb.dataOffset%BlockSize != 0:
		return fmt.Errorf("data offset %d", sb.dataOffset)
	case sb.dataSize == 0 || sb.dataSize%uint64(sb.chunkSize) != 0 || sb.dataSize > 1<<56:
		return fmt.Errorf("data size %d", sb.dataSize)
	case sb.arraySize == 0 || sb.arraySize%BlockSize != 0 ||
		sb.arraySize/uint64(sb.chunkSize) > sb.dataSize/uint64(sb.chunkSize)*uint64(sb.raidDisks)/nearCopies:
		return fmt.Errorf("array size %d", sb.arraySize)
	}
	for _, r := range sb.bad {
		if lo, hi := uint64(r.start)*BlockSize, uint64(r.start+r.count)*BlockSize; lo < sb.dataOffset || hi > sb.dataOffset+sb.dataSize {
			return fmt.Errorf("bad blocks [%d,+%d) outside the data area", r.start, r.count)
		}
	}
	regions := (sb.arraySize + sb.regionSize - 1) / sb.regionSize
	if need := (regions + bmBitsPerBlock - 1) / bmBitsPerBlock * sbSize; need > sb.bitmapBytes {
		return fmt.Errorf("bitmap of %d bytes for %d regions", sb.bitmapBytes, regions)
	}
	return nil
}

// readSuperblock reads both copies from m and returns the valid one with
// the higher sequence number. A torn write of one copy leaves the other.
func readSuperblock(m Member) (*superblock, error) {
	buf := getBounce(2 * sbSize)
	defer putBounce(buf)
	b := (*buf)[:2*sbSize]
	if _, err := m.ReadAt(b, sbCopyA); err != nil {
		return nil, fmt.Errorf("%w: read superblock: %w", ErrIO, err)
	}
	a, errA := unmarshalSuperblock(b[:sbSize])
	c, errB := unmarshalSuperblock(b[sbSize:])
	switch {
	case errA == nil && errB == nil:
		if c.seq > a.seq {
			return c, nil
		}
		return a, nil
	case errA == nil:
		return a, nil
	case errB == nil:
		return c, nil
	case errors.Is(errA, ErrNoSuperblock) && errors.Is(errB, ErrNoSuperblock):
		return nil, ErrNoSuperblock
	case errors.Is(errA, ErrNoSuperblock):
		return nil, errB
	default:
		return nil, errA
	}
}

// marshalBitmapBlock encodes block idx holding bits (bmBitsPerBlock bits,
// LSB first) into b.
func marshalBitmapBlock(b []byte, idx uint32, bits []byte) {
	clear(b[:sbSize])
	copy(b[0:4], bmMagic)
	binary.LittleEndian.PutUint32(b[4:], idx)
	copy(b[bmHeader:sbCRCOffset], bits)
	binary.LittleEndian.PutUint32(b[sbCRCOffset:], crc32.Checksum(b[:sbCRCOffset], castagnoli))
}

// unmarshalBitmapBlock checks block idx and returns its bit bytes (a
// sub-slice of b). A bad block must be treated as all ones by the caller.
func unmarshalBitmapBlock(b []byte, idx uint32) ([]byte, error) {
	if len(b) < sbSize || !bytes.Equal(b[0:4], []byte(bmMagic)) {
		return nil, fmt.Errorf("%w %d: bad magic", ErrCorruptBitmap, idx)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[sbCRCOffset:]), crc32.Checksum(b[:sbCRCOffset], castagnoli); got != want {
		return nil, fmt.Errorf("%w %d: checksum %#08x, want %#08x", ErrCorruptBitmap, idx, got, want)
	}
	if got := le.Uint32(b[4:]); got != idx {
		return nil, fmt.Errorf("%w %d: holds index %d", ErrCorruptBitmap, idx, got)
	}
	return b[bmHeader:sbCRCOffset], nil
}

// writeSuperblocksLocked writes the superblock of every live member (the
// copy the member's sequence number selects, A or B alternately) and then
// flushes each: the durability order is data, bitmap, superblock. Slots
// marked failing are recorded as faulty and get no superblock; a member
// whose write or flush fails becomes failing and the others are written
// again. Only when the table is durable do failing slots turn Faulty (and
// writes stop going to them). Caller holds metaMu.
func (a *Array) writeSuperblocksLocked(bump, clean bool) {
	if bump {
		a.events.Add(1)
	}
	recorded := false // the table reached some member durably
	for attempt := 0; attempt <= len(a.slots); attempt++ {
		sb := a.superblockLocked(clean)
		durable, failed := a.writeSuperblockRoundLocked(&sb)
		if !failed || !durable {
			recorded = durable
			break
		}
		a.events.Add(1)
	}
	a.settleFailingLocked(recorded)
}

// superblockLocked is the superblock of the array as it is now, with its
// slot table; the member fields are filled in per member. Caller holds
// metaMu.
func (a *Array) superblockLocked(clean bool) superblock {
	var sb superblock
	sb.clean = clean
	sb.arrayUUID = a.uuid
	sb.raidDisks = uint32(a.geo.n)
	sb.layout = nearCopies
	sb.chunkSize = uint32(a.geo.chunk)
	sb.dataOffset = uint64(a.geo.dataOffset)
	sb.dataSize = uint64(a.geo.dataSize)
	sb.arraySize = uint64(a.geo.size)
	sb.events = a.events.Load()
	sb.bitmapOffset = bitmapOffset
	sb.bitmapBytes = uint64(a.geo.bmBytes)
	sb.regionSize = uint64(a.geo.region)
	sb.eventsCleared = a.eventsCleared
	sb.liveCopies, sb.copyGen = a.liveCopies, a.copyGen
	sb.ctime = a.ctime
	for i, s := range a.slots {
		switch {
		case s.failing.Load():
			sb.slots[i] = slotFaulty
		case MemberState(s.state.Load()) == MemberInSync:
			sb.slots[i] = slotActive
		case MemberState(s.state.Load()) == MemberRecovering:
			sb.slots[i] = slotRecovering
		case MemberState(s.state.Load()) == MemberFaulty:
			sb.slots[i] = slotFaulty
		default:
			sb.slots[i] = slotMissing
		}
	}
	return sb
}

// writeSuperblockRoundLocked writes sb to every live member that is not
// failing, then flushes each. It reports whether some member that stays
// in the array holds it durably, and whether a member became failing (the
// table must then be written again). Caller holds metaMu.
func (a *Array) writeSuperblockRoundLocked(sb *superblock) (durable, failed bool) {
	fail := func(s *slot, what string, err error) {
		klog.ErrorS(err, "raid10: superblock "+what+" failed", "array", a.logID(), "member", s.idx)
		s.writeErrs.Add(1)
		if a.canFailLocked(s) {
			s.failing.Store(true)
			failed = true
		} else {
			s.broken.Store(true)
		}
	}
	var written [MaxMembers]*memberRef
	for i, s := range a.slots {
		r := s.live()
		if r == nil || s.failing.Load() {
			continue
		}
		sb.role = uint32(i)
		sb.memberUUID = r.uuid
		sb.recoveryOff = recoveryDone
		sb.partial = false
		if MemberState(s.state.Load()) != MemberInSync {
			sb.recoveryOff = uint64(s.recovered)
			sb.partial = !s.fullSync
		}
		sb.bad = r.bad.Load().ranges()
		s.sbSeq++
		sb.seq = s.sbSeq
		buf := AlignedBuffer(sbSize) // not shared: an abandoned write may still read it
		sb.marshal(buf)
		off := int64(sbCopyA)
		if s.sbSeq&1 == 1 {
			off = sbCopyB
		}
		if err := a.metaIO(r, func() error { _, err := r.m.WriteAt(buf, off); return err }); err != nil {
			fail(s, "write", err)
			continue
		}
		written[i] = r
	}
	for i, s := range a.slots {
		if written[i] == nil {
			continue
		}
		r := written[i]
		if err := a.metaIO(r, r.m.Flush); err != nil {
			fail(s, "flush", err)
		}
	}
	for i := range a.slots {
		if written[i] != nil && !a.slots[i].failing.Load() && !a.slots[i].broken.Load() {
			durable = true
		}
	}
	return durable, failed
}

// settleFailingLocked ends the failing state of every failing slot: Faulty
// (out of the array, writes stop going to it) if the table recording it
// reached some member durably, else broken. Caller holds metaMu.
func (a *Array) settleFailingLocked(recorded bool) {
	for _, s := range a.slots {
		if !s.failing.Load() {
			continue
		}
		if recorded {
			s.state.Store(int32(MemberFaulty))
			s.broken.Store(false) // out of the array now: nothing of it counts
			if r := s.ref.Load(); r != nil {
				a.kill(r) // waiters on its calls give up on it
			}
		} else {
			// No member holds the record: after a crash this member would
			// come back in sync, so it must stay in the array, broken.
			s.broken.Store(true)
		}
		s.failing.Store(false)
	}
}
