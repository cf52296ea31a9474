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
	head := make([]byte, min(size, probeHead))
	if _, err := r.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("pool: read disk head: %w", err)
	}
	tailOff := max(0, size-probeTail)
	tail := make([]byte, size-tailOff)
	if _, err := r.ReadAt(tail, tailOff); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("pool: read disk tail: %w", err)
	}
	// at returns n bytes at absolute offset off, or nil when they were not read.
	at := func(off int64, n int) []byte {
		if off >= 0 && off+int64(n) <= int64(len(head)) {
			return head[off : off+int64(n)]
		}
		if off >= tailOff && off+int64(n) <= size {
			return tail[off-tailOff : off-tailOff+int64(n)]
		}
		return nil
	}
	is := func(off int64, magic string) bool { return bytes.Equal(at(off, len(magic)), []byte(magic)) }
	var found []Signature
	add := func(name string, off int64) { found = append(found, Signature{Name: name, Offset: off}) }

	for _, off := range []int64{512, 4096} {
		if is(off, "EFI PART") {
			add("GPT partition table", off)
			break
		}
	}
	bootSector := false
	switch {
	case is(3, "NTFS    "):
		add("ntfs filesystem", 3)
		bootSector = true
	case is(3, "EXFAT   "):
		add("exfat filesystem", 3)
		bootSector = true
	case is(510, "\x55\xaa") && (is(54, "FAT12   ") || is(54, "FAT16   ")):
		add("vfat filesystem", 54)
		bootSector = true
	case is(510, "\x55\xaa") && is(82, "FAT32   "):
		add("vfat filesystem", 82)
		bootSector = true
	}
	if !bootSector && is(510, "\x55\xaa") && len(found) == 0 {
		add("MBR (DOS) partition table", 510)
	}
	if is(1024+56, "\x53\xef") {
		add(extName(at(1024, 1024)), 1024+56)
	}
	if is(0, "XFSB") {
		add("xfs filesystem", 0)
	}
	if is(65536+64, "_BHRfS_M") {
		add("btrfs filesystem", 65536+64)
	}
	for _, ps := range []int64{4096, 8192, 16384, 65536} {
		if is(ps-10, "SWAPSPACE2") || is(ps-10, "SWAP-SPACE") {
			add("swap space", ps-10)
			break
		}
	}
	for s := int64(0); s < 4; s++ {
		if is(s*512, "LABELONE") && is(s*512+24, "LVM2 001") {
			add("LVM2 physical volume", s*512)
			break
		}
	}
	mdLE := func(off int64) bool {
		b := at(off, 4)
		return b != nil && binary.LittleEndian.Uint32(b) == mdMagic
	}
	mdBE := func(off int64) bool {
		b := at(off, 4)
		return b != nil && binary.BigEndian.Uint32(b) == mdMagic
	}
	switch {
	case mdLE(0):
		add("md RAID superblock 1.1", 0)
	case mdLE(4096):
		add("md RAID superblock 1.2", 4096)
	}
	if sectors := size / 512; sectors >= 2*128 {
		if off := ((sectors - 16) &^ 7) * 512; mdLE(off) {
			add("md RAID superblock 1.0", off)
		}
		if off := ((sectors &^ 127) - 128) * 512; mdLE(off) || mdBE(off) {
			add("md RAID superblock 0.90", off)
		}
	}
	if is(0, "LUKS\xba\xbe") {
		add("LUKS encrypted volume", 0)
	}
	if bytes.Equal(at(4096+24, len(bcacheMagic)), bcacheMagic) {
		add("bcache superblock", 4096+24)
	}
	if is(32769, "CD001") {
		add("iso9660 filesystem", 32769)
	}
	return found, nil
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
