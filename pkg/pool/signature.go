package pool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Signature is an on-disk structure found on a disk that the pool did not write: a
// partition table, a filesystem, a RAID or LVM label. The pool never claims a disk that
// carries one unless the disk's configuration opts in to wiping it.
type Signature struct {
	// Name says what was found, e.g. "ext4 filesystem" or "GPT partition table".
	Name string `json:"name"`
	// Offset is the byte offset of the magic number that identified it.
	Offset int64 `json:"offset"`
}

// String names the signature and where its magic was found.
func (s Signature) String() string { return fmt.Sprintf("%s (magic at byte %d)", s.Name, s.Offset) }

// probeHead is how much of a disk's head DetectSignatures reads: it covers the pool label
// area, btrfs's superblock at 64 KiB and iso9660's volume descriptor at 32 KiB.
const probeHead = LabelAreaSize

// probeTail is how much of a disk's tail DetectSignatures reads: md 0.90 and 1.0
// superblocks live in the last 128 KiB.
const probeTail = 128 << 10

// mdMagic is the md RAID superblock magic (0.90 and 1.x), little-endian on disk for 1.x and
// native-endian for 0.90.
const mdMagic = 0xa92b4efc

// bcacheMagic is the bcache superblock magic at byte 4096+24.
var bcacheMagic = []byte{0xc6, 0x85, 0x73, 0xf6, 0x4e, 0x1a, 0x45, 0xca, 0x82, 0x65, 0xf5, 0x7f, 0x48, 0xba, 0x6d, 0x81}

// DetectSignatures reads the head and tail of a disk of the given size and reports every
// foreign signature it recognises, in the order of the checks below. It only reads. A pool
// label of this project is not a foreign signature (see HasPoolLabel).
//
// The checks, with the byte offsets of their magic numbers (as in util-linux's libblkid):
//
//	GPT             "EFI PART" at 512 (512-byte sectors) or 4096 (4 KiB sectors)
//	MBR             0x55 0xAA at 510, when the sector is not a FAT/NTFS/exFAT boot sector
//	ext2/3/4        0xEF53 (LE) at 1024+56; the feature flags tell ext2, ext3 and ext4 apart
//	xfs             "XFSB" at 0
//	btrfs           "_BHRfS_M" at 65536+64
//	swap            "SWAPSPACE2" or "SWAP-SPACE" at page size - 10, page sizes 4, 8, 16, 64 KiB
//	vfat            0x55AA at 510 and "FAT12   "/"FAT16   " at 54 or "FAT32   " at 82
//	ntfs            "NTFS    " at 3;  exfat "EXFAT   " at 3
//	LVM2 PV         "LABELONE" at the start of sector 0..3 with "LVM2 001" 24 bytes later
//	md RAID 1.1/1.2 0xa92b4efc (LE) at 0 / 4096
//	md RAID 1.0     0xa92b4efc (LE) at ((size/512 - 16) &^ 7) * 512
//	md RAID 0.90    0xa92b4efc (either endianness) at ((size/512 &^ 127) - 128) * 512
//	LUKS            "LUKS\xba\xbe" at 0
//	bcache          its 16-byte magic at 4096+24
//	iso9660         "CD001" at 32769
func DetectSignatures(r io.ReaderAt, size int64) ([]Signature, error) {
	b, err := readHeadTail(r, size)
	if err != nil {
		return nil, err
	}
	d := &detector{diskBytes: b}
	d.partitionTables()
	d.filesystems()
	d.volumeLayers()
	if d.is(32769, "CD001") {
		d.add("iso9660 filesystem", 32769)
	}
	return d.found, nil
}

// diskBytes is the head and the tail of a disk as DetectSignatures read them.
type diskBytes struct {
	head, tail    []byte
	tailOff, size int64
}

// readHeadTail reads the first probeHead and the last probeTail bytes of a disk of size
// bytes.
func readHeadTail(r io.ReaderAt, size int64) (diskBytes, error) {
	head := make([]byte, min(size, probeHead))
	if _, err := r.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
		return diskBytes{}, fmt.Errorf("pool: read disk head: %w", err)
	}
	tailOff := max(0, size-probeTail)
	tail := make([]byte, size-tailOff)
	if _, err := r.ReadAt(tail, tailOff); err != nil && !errors.Is(err, io.EOF) {
		return diskBytes{}, fmt.Errorf("pool: read disk tail: %w", err)
	}
	return diskBytes{head: head, tail: tail, tailOff: tailOff, size: size}, nil
}

// at returns n bytes at absolute offset off, or nil when they were not read.
func (b diskBytes) at(off int64, n int) []byte {
	if off >= 0 && off+int64(n) <= int64(len(b.head)) {
		return b.head[off : off+int64(n)]
	}
	if off >= b.tailOff && off+int64(n) <= b.size {
		return b.tail[off-b.tailOff : off-b.tailOff+int64(n)]
	}
	return nil
}

// is reports whether magic stands at off.
func (b diskBytes) is(off int64, magic string) bool {
	return bytes.Equal(b.at(off, len(magic)), []byte(magic))
}

// md reports whether the md superblock magic stands at off in the byte order o.
func (b diskBytes) md(off int64, o binary.ByteOrder) bool {
	m := b.at(off, 4)
	return m != nil && o.Uint32(m) == mdMagic
}

// detector collects the signatures found, in the order of the checks.
type detector struct {
	diskBytes
	found []Signature
}

func (d *detector) add(name string, off int64) {
	d.found = append(d.found, Signature{Name: name, Offset: off})
}

// partitionTables checks for GPT, for the boot sectors of ntfs, exfat and vfat, and for an
// MBR where none of those is found.
func (d *detector) partitionTables() {
	for _, off := range []int64{512, 4096} {
		if d.is(off, "EFI PART") {
			d.add("GPT partition table", off)
			break
		}
	}
	bootSector := false
	switch {
	case d.is(3, "NTFS    "):
		d.add("ntfs filesystem", 3)
		bootSector = true
	case d.is(3, "EXFAT   "):
		d.add("exfat filesystem", 3)
		bootSector = true
	case d.is(510, "\x55\xaa") && (d.is(54, "FAT12   ") || d.is(54, "FAT16   ")):
		d.add("vfat filesystem", 54)
		bootSector = true
	case d.is(510, "\x55\xaa") && d.is(82, "FAT32   "):
		d.add("vfat filesystem", 82)
		bootSector = true
	}
	if !bootSector && d.is(510, "\x55\xaa") && len(d.found) == 0 {
		d.add("MBR (DOS) partition table", 510)
	}
}

// filesystems checks for ext2/3/4, xfs, btrfs and swap.
func (d *detector) filesystems() {
	if d.is(1024+56, "\x53\xef") {
		d.add(extName(d.at(1024, 1024)), 1024+56)
	}
	if d.is(0, "XFSB") {
		d.add("xfs filesystem", 0)
	}
	if d.is(65536+64, "_BHRfS_M") {
		d.add("btrfs filesystem", 65536+64)
	}
	for _, ps := range []int64{4096, 8192, 16384, 65536} {
		if d.is(ps-10, "SWAPSPACE2") || d.is(ps-10, "SWAP-SPACE") {
			d.add("swap space", ps-10)
			break
		}
	}
}

// volumeLayers checks for what stacks block devices: LVM2, md RAID, LUKS and bcache.
func (d *detector) volumeLayers() {
	for s := int64(0); s < 4; s++ {
		if d.is(s*512, "LABELONE") && d.is(s*512+24, "LVM2 001") {
			d.add("LVM2 physical volume", s*512)
			break
		}
	}
	le, be := binary.LittleEndian, binary.BigEndian
	switch {
	case d.md(0, le):
		d.add("md RAID superblock 1.1", 0)
	case d.md(4096, le):
		d.add("md RAID superblock 1.2", 4096)
	}
	if sectors := d.size / 512; sectors >= 2*128 {
		if off := ((sectors - 16) &^ 7) * 512; d.md(off, le) {
			d.add("md RAID superblock 1.0", off)
		}
		if off := ((sectors &^ 127) - 128) * 512; d.md(off, le) || d.md(off, be) {
			d.add("md RAID superblock 0.90", off)
		}
	}
	if d.is(0, "LUKS\xba\xbe") {
		d.add("LUKS encrypted volume", 0)
	}
	if bytes.Equal(d.at(4096+24, len(bcacheMagic)), bcacheMagic) {
		d.add("bcache superblock", 4096+24)
	}
}

// extName tells ext2, ext3 and ext4 apart from the superblock's feature flags the way
// libblkid does: a journal makes ext3, any incompat/ro_compat flag ext3 lacks makes ext4.
func extName(sb []byte) string {
	const (
		compatHasJournal   = 0x0004
		ext3IncompatOK     = 0x0002 | 0x0004 // filetype, recover
		ext3RoCompatOK     = 0x0001 | 0x0002 | 0x0004
		offCompat          = 0x5c
		offIncompat        = 0x60
		offRoCompat        = 0x64
		superblockReadSize = offRoCompat + 4
	)
	if len(sb) < superblockReadSize {
		return "ext filesystem"
	}
	compat := binary.LittleEndian.Uint32(sb[offCompat:])
	incompat := binary.LittleEndian.Uint32(sb[offIncompat:])
	roCompat := binary.LittleEndian.Uint32(sb[offRoCompat:])
	switch {
	case incompat&^ext3IncompatOK != 0 || roCompat&^ext3RoCompatOK != 0:
		return "ext4 filesystem"
	case compat&compatHasJournal != 0:
		return "ext3 filesystem"
	default:
		return "ext2 filesystem"
	}
}

// SignatureError is returned when a disk offered to the pool carries a foreign signature.
// It matches ErrForeignSignature with errors.Is.
type SignatureError struct {
	// Disk is the path the disk was offered under.
	Disk string
	// Found lists what was found.
	Found []Signature
}

// Error names the disk and every signature found on it.
func (e *SignatureError) Error() string {
	names := make([]string, len(e.Found))
	for i, s := range e.Found {
		names[i] = s.String()
	}
	return fmt.Sprintf("pool: refusing disk %s: it carries %s; it was left untouched (set wipe for this disk to erase it)",
		e.Disk, strings.Join(names, ", "))
}

// Is makes errors.Is(err, ErrForeignSignature) true.
func (e *SignatureError) Is(target error) bool { return target == ErrForeignSignature }
