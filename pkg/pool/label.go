package pool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Pool label geometry. See docs/on-disk-format.md, section "Pool label", for the byte map.
const (
	// LabelAreaSize is the head of every pool disk reserved for the label; extents start
	// at or after it.
	LabelAreaSize = 1 << 20
	// LabelSlotSize is the size of each of the two label copies (slot 0 at byte 0, slot 1
	// at byte LabelSlotSize).
	LabelSlotSize = 256 << 10
	// LabelVersion is the label format version this code writes. It reads this one and
	// labelVersionNoTombstones.
	LabelVersion = 2
	// labelVersionNoTombstones is the first version: no tombstone table (header bytes
	// 168..171 zero). Labels of this version are still read.
	labelVersionNoTombstones = 1

	labelHeaderSize = 256
	diskEntrySize   = 64
	extentEntrySize = 128
	tombstoneSize   = 32
	maxNameLen      = 63 // volume and pool names: NUL-padded 64-byte fields
	maxIdentityLen  = 31
	// MaxDisks is how many disks one pool's disk table holds.
	MaxDisks = 64
	// MaxExtentsPerDisk bounds the extents on one disk; fewer fit when volumes have many
	// members (each extent also carries its volume's member map, 16 bytes per member).
	MaxExtentsPerDisk = 1024
	// MaxTombstones bounds the tombstone table of a label: when a delete would add one
	// more, the entry with the lowest sequence number is dropped.
	MaxTombstones = 256
)

// labelMagic opens every label slot.
var labelMagic = [8]byte{'R', '1', '0', 'P', 'O', 'O', 'L', 0}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// DiskFlags are a disk table entry's flags.
type DiskFlags uint8

// DiskFlagAway marks a disk the pool started without (it was missing) and has not yet had
// every volume with a role on it assembled with that role since it came back: its members
// may have missed writes that only their absent partners' superblocks record, so the
// engine trusts none of them alone (raid10.AssembleOptions.Doubtful).
const DiskFlagAway DiskFlags = 1

// DiskState is a disk's state in the pool's disk table.
type DiskState uint8

// Disk states as stored in the label.
const (
	// DiskActive holds (or may hold) volume extents.
	DiskActive DiskState = 1
	// DiskSpare is a hot spare: it holds no extents until a disk fails.
	DiskSpare DiskState = 2
	// DiskFailed was marked failed (I/O errors or an operator); its extents are not used.
	DiskFailed DiskState = 3
	// DiskRemoved was replaced; if it comes back it is not used again without a wipe.
	DiskRemoved DiskState = 4
)

// String names the state as operators see it.
func (s DiskState) String() string {
	switch s {
	case DiskActive:
		return "Active"
	case DiskSpare:
		return "Spare"
	case DiskFailed:
		return "Failed"
	case DiskRemoved:
		return "Removed"
	}
	return fmt.Sprintf("DiskState(%d)", uint8(s))
}

// DiskEntry is one row of the pool's disk table, kept on every disk of the pool.
type DiskEntry struct {
	UUID     UUID
	State    DiskState
	Flags    DiskFlags
	Size     uint64
	Identity string // serial or WWN at claim time, "" for files
}

// ExtentEntry is one volume extent on the disk that carries the label.
type ExtentEntry struct {
	Volume     UUID
	Offset     uint64 // bytes from the start of the disk
	Length     uint64 // bytes
	VolumeSize uint64 // the volume's usable size in bytes
	Epoch      uint64 // the volume's map version: raised each time a role moves to another disk
	Role       uint16 // the member slot of this extent in the volume's array
	Members    uint16 // the volume's member count
	Flags      uint32 // ExtentFlagDeleting, ExtentFlagCreating, ExtentFlagSnapshot, ExtentFlagCopy...
	// CopySource is the first 8 bytes of the UUID of the volume or snapshot a copy target
	// was filled from (ExtentFlagCopy), zero otherwise: Open knows the relation without
	// assembling the target.
	CopySource [8]byte
	Name       string // the volume's name
	// MemberDisks is the volume's member map at Epoch: the disk UUID holding each role.
	MemberDisks []UUID
}

// Tombstone records a deleted volume, snapshot or clone, so that no assembly path brings
// it back from extents left on a disk that was away (or failed) when it was deleted. The
// same list is written into every label the pool writes; Open takes the union of the
// lists of every disk it reads.
type Tombstone struct {
	Volume  UUID   // the deleted object's UUID (UUIDs are never reused)
	Seq     uint64 // delete sequence: one more than the highest the pool knew at the delete
	Deleted int64  // delete time, Unix nanoseconds (for operators; Seq orders)
}

// Label is the decoded pool label of one disk.
type Label struct {
	Generation uint64 // raised on every write of this disk's label
	PoolEpoch  uint64 // raised on every change of the disk table
	Pool       UUID
	Disk       UUID
	PoolName   string
	DiskSize   uint64
	DataStart  uint64
	DataEnd    uint64
	Alignment  uint32
	Disks      []DiskEntry
	Extents    []ExtentEntry
	// Tombstones lists the objects the pool deleted whose extents may still be on a disk
	// that was away (at most MaxTombstones, in Seq order).
	Tombstones []Tombstone
}

// encodedLen is the byte length the label occupies before its checksum.
func (l *Label) encodedLen() int {
	n := labelHeaderSize + len(l.Disks)*diskEntrySize + len(l.Extents)*extentEntrySize
	for _, x := range l.Extents {
		n += 16 * int(x.Members)
	}
	return n + len(l.Tombstones)*tombstoneSize
}

// Encode returns the label's slot image: the encoded label, its crc32c and zero padding up
// to LabelSlotSize.
func (l *Label) Encode() ([]byte, error) {
	if len(l.Disks) > MaxDisks {
		return nil, fmt.Errorf("%w: %d disks in the table, at most %d", ErrInvalidArgument, len(l.Disks), MaxDisks)
	}
	if len(l.Extents) > MaxExtentsPerDisk {
		return nil, fmt.Errorf("%w: %d extents on one disk, at most %d", ErrNoSpace, len(l.Extents), MaxExtentsPerDisk)
	}
	if len(l.Tombstones) > MaxTombstones {
		return nil, fmt.Errorf("%w: %d tombstones, at most %d", ErrInvalidArgument, len(l.Tombstones), MaxTombstones)
	}
	n := l.encodedLen()
	if n+4 > LabelSlotSize {
		return nil, fmt.Errorf("%w: label of %d bytes does not fit its %d-byte slot", ErrNoSpace, n+4, LabelSlotSize)
	}
	for i, x := range l.Extents {
		if len(x.MemberDisks) != int(x.Members) {
			return nil, fmt.Errorf("%w: extent %d has %d member disks for %d members", ErrInvalidArgument, i, len(x.MemberDisks), x.Members)
		}
	}
	b := make([]byte, LabelSlotSize)
	le := binary.LittleEndian
	copy(b[0:8], labelMagic[:])
	le.PutUint16(b[8:], LabelVersion)
	le.PutUint16(b[10:], labelHeaderSize)
	le.PutUint32(b[12:], uint32(n))
	le.PutUint64(b[16:], l.Generation)
	le.PutUint64(b[24:], l.PoolEpoch)
	copy(b[32:48], l.Pool[:])
	copy(b[48:64], l.Disk[:])
	le.PutUint64(b[64:], l.DiskSize)
	le.PutUint64(b[72:], l.DataStart)
	le.PutUint64(b[80:], l.DataEnd)
	le.PutUint32(b[88:], l.Alignment)
	le.PutUint16(b[92:], uint16(len(l.Disks)))
	le.PutUint16(b[94:], uint16(len(l.Extents)))
	le.PutUint16(b[96:], diskEntrySize)
	le.PutUint16(b[98:], extentEntrySize)
	// 100..103 flags, 0
	if err := putName(b[104:168], l.PoolName, maxNameLen); err != nil {
		return nil, err
	}
	le.PutUint16(b[168:], uint16(len(l.Tombstones)))
	le.PutUint16(b[170:], tombstoneSize)
	off := labelHeaderSize
	for _, d := range l.Disks {
		e := b[off : off+diskEntrySize]
		copy(e[0:16], d.UUID[:])
		e[16] = byte(d.State)
		e[17] = byte(d.Flags)
		le.PutUint64(e[24:], d.Size)
		id := d.Identity
		if len(id) > maxIdentityLen {
			id = id[len(id)-maxIdentityLen:] // the tail of a serial or WWN is its distinctive part
		}
		copy(e[32:64], id)
		off += diskEntrySize
	}
	for _, x := range l.Extents {
		e := b[off : off+extentEntrySize]
		copy(e[0:16], x.Volume[:])
		le.PutUint64(e[16:], x.Offset)
		le.PutUint64(e[24:], x.Length)
		le.PutUint64(e[32:], x.VolumeSize)
		le.PutUint64(e[40:], x.Epoch)
		le.PutUint16(e[48:], x.Role)
		le.PutUint16(e[50:], x.Members)
		le.PutUint32(e[52:], x.Flags)
		copy(e[56:64], x.CopySource[:])
		if err := putName(e[64:128], x.Name, maxNameLen); err != nil {
			return nil, err
		}
		off += extentEntrySize
	}
	for _, x := range l.Extents {
		for _, u := range x.MemberDisks {
			copy(b[off:off+16], u[:])
			off += 16
		}
	}
	for _, ts := range l.Tombstones {
		e := b[off : off+tombstoneSize]
		copy(e[0:16], ts.Volume[:])
		le.PutUint64(e[16:], ts.Seq)
		le.PutUint64(e[24:], uint64(ts.Deleted))
		off += tombstoneSize
	}
	le.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	return b, nil
}

func putName(dst []byte, s string, maxLen int) error {
	if len(s) > maxLen || bytes.IndexByte([]byte(s), 0) >= 0 {
		return fmt.Errorf("%w: name %q longer than %d bytes or contains NUL", ErrInvalidArgument, s, maxLen)
	}
	copy(dst, s)
	return nil
}

func getName(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// errNoLabel means the slot does not start with the label magic.
var errNoLabel = errors.New("pool: no pool label")

// DecodeLabel decodes one label slot. It returns errNoLabel when the magic is absent,
// ErrLabelVersion for a version it does not know and ErrCorruptLabel for anything else
// that does not check out. It never panics, whatever b holds.
func DecodeLabel(b []byte) (*Label, error) {
	if len(b) < labelHeaderSize || !bytes.Equal(b[0:8], labelMagic[:]) {
		return nil, errNoLabel
	}
	le := binary.LittleEndian
	v := le.Uint16(b[8:])
	if v != LabelVersion && v != labelVersionNoTombstones {
		return nil, fmt.Errorf("%w: version %d (this build reads %d and %d)", ErrLabelVersion, v, labelVersionNoTombstones, LabelVersion)
	}
	n := int(le.Uint32(b[12:]))
	nd, nx, nt := int(le.Uint16(b[92:])), int(le.Uint16(b[94:])), int(le.Uint16(b[168:]))
	wantTombSize := uint16(tombstoneSize)
	if v == labelVersionNoTombstones {
		wantTombSize = 0 // bytes 168..171 were reserved, zero
	}
	switch {
	case le.Uint16(b[10:]) != labelHeaderSize || le.Uint16(b[96:]) != diskEntrySize || le.Uint16(b[98:]) != extentEntrySize ||
		le.Uint16(b[170:]) != wantTombSize:
		return nil, fmt.Errorf("%w: unexpected header or entry sizes", ErrCorruptLabel)
	case nt > MaxTombstones || v == labelVersionNoTombstones && nt != 0:
		return nil, fmt.Errorf("%w: %d tombstones in a version %d label", ErrCorruptLabel, nt, v)
	case n < labelHeaderSize || n+4 > len(b) || n+4 > LabelSlotSize:
		return nil, fmt.Errorf("%w: length %d out of range", ErrCorruptLabel, n)
	case n < labelHeaderSize+nd*diskEntrySize+nx*extentEntrySize+nt*tombstoneSize:
		return nil, fmt.Errorf("%w: length %d too short for %d disks, %d extents and %d tombstones", ErrCorruptLabel, n, nd, nx, nt)
	}
	if got, want := crc32.Checksum(b[:n], castagnoli), le.Uint32(b[n:]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, expected %08x", ErrCorruptLabel, got, want)
	}
	l := &Label{
		Generation: le.Uint64(b[16:]),
		PoolEpoch:  le.Uint64(b[24:]),
		DiskSize:   le.Uint64(b[64:]),
		DataStart:  le.Uint64(b[72:]),
		DataEnd:    le.Uint64(b[80:]),
		Alignment:  le.Uint32(b[88:]),
		PoolName:   getName(b[104:168]),
	}
	copy(l.Pool[:], b[32:48])
	copy(l.Disk[:], b[48:64])
	off := labelHeaderSize
	for range nd {
		e := b[off : off+diskEntrySize]
		var d DiskEntry
		copy(d.UUID[:], e[0:16])
		d.State = DiskState(e[16])
		d.Flags = DiskFlags(e[17])
		d.Size = le.Uint64(e[24:])
		d.Identity = getName(e[32:64])
		l.Disks = append(l.Disks, d)
		off += diskEntrySize
	}
	for range nx {
		e := b[off : off+extentEntrySize]
		var x ExtentEntry
		copy(x.Volume[:], e[0:16])
		x.Offset = le.Uint64(e[16:])
		x.Length = le.Uint64(e[24:])
		x.VolumeSize = le.Uint64(e[32:])
		x.Epoch = le.Uint64(e[40:])
		x.Role = le.Uint16(e[48:])
		x.Members = le.Uint16(e[50:])
		x.Flags = le.Uint32(e[52:])
		copy(x.CopySource[:], e[56:64])
		x.Name = getName(e[64:128])
		l.Extents = append(l.Extents, x)
		off += extentEntrySize
	}
	for i := range l.Extents {
		x := &l.Extents[i]
		if off+16*int(x.Members) > n {
			return nil, fmt.Errorf("%w: member maps run past the label length %d", ErrCorruptLabel, n)
		}
		x.MemberDisks = make([]UUID, x.Members)
		for j := range x.MemberDisks {
			copy(x.MemberDisks[j][:], b[off:off+16])
			off += 16
		}
	}
	if off+nt*tombstoneSize > n {
		return nil, fmt.Errorf("%w: tombstones run past the label length %d", ErrCorruptLabel, n)
	}
	for range nt {
		e := b[off : off+tombstoneSize]
		var ts Tombstone
		copy(ts.Volume[:], e[0:16])
		ts.Seq = le.Uint64(e[16:])
		ts.Deleted = int64(le.Uint64(e[24:]))
		l.Tombstones = append(l.Tombstones, ts)
		off += tombstoneSize
	}
	if off != n {
		return nil, fmt.Errorf("%w: length %d, contents %d", ErrCorruptLabel, n, off)
	}
	if err := l.check(); err != nil {
		return nil, err
	}
	return l, nil
}

// check validates what the checksum cannot: geometry and extents inside the data area,
// without overlaps.
func (l *Label) check() error {
	if l.Pool.IsZero() || l.Disk.IsZero() {
		return fmt.Errorf("%w: zero pool or disk UUID", ErrCorruptLabel)
	}
	if l.DataStart < LabelAreaSize || l.DataEnd > l.DiskSize || l.DataStart > l.DataEnd || l.Alignment == 0 {
		return fmt.Errorf("%w: data area [%d, %d) of a %d-byte disk", ErrCorruptLabel, l.DataStart, l.DataEnd, l.DiskSize)
	}
	for i, x := range l.Extents {
		if x.Offset < l.DataStart || x.Length == 0 || x.Offset+x.Length > l.DataEnd || x.Offset+x.Length < x.Offset {
			return fmt.Errorf("%w: extent %d [%d, +%d) outside the data area", ErrCorruptLabel, i, x.Offset, x.Length)
		}
		if x.Members < 2 || x.Role >= x.Members {
			return fmt.Errorf("%w: extent %d role %d of %d members", ErrCorruptLabel, i, x.Role, x.Members)
		}
		if len(x.MemberDisks) != int(x.Members) || x.MemberDisks[x.Role] != l.Disk {
			return fmt.Errorf("%w: extent %d: the member map does not give role %d to this disk", ErrCorruptLabel, i, x.Role)
		}
		for j := range i {
			y := l.Extents[j]
			if x.Offset < y.Offset+y.Length && y.Offset < x.Offset+x.Length {
				return fmt.Errorf("%w: extents %d and %d overlap", ErrCorruptLabel, j, i)
			}
		}
	}
	return nil
}

// labelSlots is the result of reading both slots of a disk.
type labelSlots struct {
	label    *Label // the valid slot with the highest generation, nil if none
	slot     int    // its index
	errs     [2]error
	anyMagic bool // at least one slot starts with the magic
	readErr  bool // a slot could not be read: the disk answered with an error, not with data
}

// readLabel reads both slots and picks the valid one with the highest generation. A torn
// write leaves at most one slot invalid.
func readLabel(r io.ReaderAt) labelSlots {
	var res labelSlots
	buf := make([]byte, LabelSlotSize)
	for s := range 2 {
		if _, err := r.ReadAt(buf, int64(s)*LabelSlotSize); err != nil && !errors.Is(err, io.EOF) {
			res.errs[s] = fmt.Errorf("pool: read label slot %d: %w", s, err)
			res.readErr = true
			continue
		}
		l, err := DecodeLabel(buf)
		if !errors.Is(err, errNoLabel) {
			res.anyMagic = true
		}
		res.errs[s] = err
		if err == nil && (res.label == nil || l.Generation > res.label.Generation) {
			res.label, res.slot = l, s
		}
	}
	return res
}

// err summarises why no slot was usable.
func (s labelSlots) err() error {
	if s.label != nil {
		return nil
	}
	if s.readErr {
		// A disk that cannot be read is not blank: it may be a member whose head went bad,
		// or one that answers again later. Never claim it.
		return fmt.Errorf("%w: slot 0: %s; slot 1: %s", ErrLabelUnreadable, errText(s.errs[0]), errText(s.errs[1]))
	}
	if !s.anyMagic {
		return errNoLabel
	}
	for _, e := range s.errs {
		if errors.Is(e, ErrLabelVersion) {
			return e
		}
	}
	// The slot errors are text here: wrapping them would make a disk with one slot
	// without magic match errNoLabel, i.e. pass for blank.
	return fmt.Errorf("%w: slot 0: %s; slot 1: %s", ErrCorruptLabel, errText(s.errs[0]), errText(s.errs[1]))
}

func errText(err error) string {
	if err == nil {
		return "valid"
	}
	return err.Error()
}
