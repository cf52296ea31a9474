package pool

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// sparse makes a zeroed sparse file of size bytes.
func sparse(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
}

func poke(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func hashFile(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func detect(t *testing.T, path string) []Signature {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	sigs, err := DetectSignatures(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return sigs
}

// blkidType asks util-linux for a second opinion; "" when blkid is not installed or finds
// nothing.
func blkidType(path string) string {
	out, err := exec.Command("blkid", "-p", "-o", "value", "-s", "TYPE", path).Output()
	if err != nil {
		out, err = exec.Command("blkid", "-p", "-o", "value", "-s", "PTTYPE", path).Output()
		if err != nil {
			return ""
		}
	}
	return strings.TrimSpace(string(out))
}

func TestDetectSignaturesRealTools(t *testing.T) {
	cases := []struct {
		name  string
		size  int64
		cmd   []string // the image path is appended
		want  string   // prefix of the Signature name
		blkid string
	}{
		{"ext4", 64 << 20, []string{"mkfs.ext4", "-q", "-F"}, "ext4 filesystem", "ext4"},
		{"ext3", 64 << 20, []string{"mkfs.ext4", "-q", "-F", "-t", "ext3"}, "ext3 filesystem", "ext3"},
		{"ext2", 64 << 20, []string{"mkfs.ext4", "-q", "-F", "-t", "ext2"}, "ext2 filesystem", "ext2"},
		{"xfs", 512 << 20, []string{"mkfs.xfs", "-q", "-f"}, "xfs filesystem", "xfs"},
		{"swap", 64 << 20, []string{"mkswap"}, "swap space", "swap"},
		{"vfat", 64 << 20, []string{"mkfs.vfat"}, "vfat filesystem", "vfat"},
		{"btrfs", 256 << 20, []string{"mkfs.btrfs", "-q", "-f"}, "btrfs filesystem", "btrfs"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			testenv.RequireTools(t, c.cmd[0], "blkid")
			img := t.TempDir() + "/img"
			sparse(t, img, c.size)
			if out, err := exec.Command(c.cmd[0], append(c.cmd[1:], img)...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v\n%s", c.cmd, err, out)
			}
			sigs := detect(t, img)
			if len(sigs) == 0 || !strings.HasPrefix(sigs[0].Name, c.want) {
				t.Fatalf("found %v, want %s", sigs, c.want)
			}
			if got := blkidType(img); got != c.blkid {
				t.Errorf("blkid says %q, expected %q", got, c.blkid)
			}
		})
	}
}

func TestDetectSignaturesSynthetic(t *testing.T) {
	le32 := func(v uint32) []byte { b := make([]byte, 4); binary.LittleEndian.PutUint32(b, v); return b }
	const size = 64 << 20
	mdEnd := int64(((size/512 - 16) &^ 7) * 512)
	md090 := int64(((size/512)&^127 - 128) * 512)
	cases := []struct {
		name  string
		pokes map[int64][]byte
		want  string
	}{
		{"blank", nil, ""},
		{"gpt", map[int64][]byte{510: {0x55, 0xaa}, 512: []byte("EFI PART")}, "GPT partition table"},
		{"gpt 4k", map[int64][]byte{510: {0x55, 0xaa}, 4096: []byte("EFI PART")}, "GPT partition table"},
		{"mbr", map[int64][]byte{510: {0x55, 0xaa}}, "MBR (DOS) partition table"},
		{"ntfs", map[int64][]byte{3: []byte("NTFS    "), 510: {0x55, 0xaa}}, "ntfs filesystem"},
		{"lvm2", map[int64][]byte{512: []byte("LABELONE"), 512 + 24: []byte("LVM2 001")}, "LVM2 physical volume"},
		{"md 1.2", map[int64][]byte{4096: le32(mdMagic)}, "md RAID superblock 1.2"},
		{"md 1.1", map[int64][]byte{0: le32(mdMagic)}, "md RAID superblock 1.1"},
		{"md 1.0", map[int64][]byte{mdEnd: le32(mdMagic)}, "md RAID superblock 1.0"},
		{"md 0.90", map[int64][]byte{md090: le32(mdMagic)}, "md RAID superblock 0.90"},
		{"luks", map[int64][]byte{0: []byte("LUKS\xba\xbe")}, "LUKS encrypted volume"},
		{"bcache", map[int64][]byte{4096 + 24: bcacheMagic}, "bcache superblock"},
		{"iso9660", map[int64][]byte{32769: []byte("CD001")}, "iso9660 filesystem"},
		{"btrfs", map[int64][]byte{65536 + 64: []byte("_BHRfS_M")}, "btrfs filesystem"},
		{"xfs", map[int64][]byte{0: []byte("XFSB")}, "xfs filesystem"},
		{"swap 64k pages", map[int64][]byte{65536 - 10: []byte("SWAPSPACE2")}, "swap space"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img := t.TempDir() + "/img"
			sparse(t, img, size)
			for off, b := range c.pokes {
				poke(t, img, off, b)
			}
			sigs := detect(t, img)
			switch {
			case c.want == "" && len(sigs) != 0:
				t.Fatalf("blank disk: found %v", sigs)
			case c.want != "" && (len(sigs) == 0 || sigs[0].Name != c.want):
				t.Fatalf("found %v, want %s", sigs, c.want)
			}
		})
	}
}

// TestForeignDiskRefusedUntouched offers a disk with an ext4 filesystem to the pool, at
// Open and at run time: it is refused with its path and the signature named, and not one
// byte changes. With wipe set for it, it is claimed.
func TestForeignDiskRefusedUntouched(t *testing.T) {
	testenv.RequireTools(t, "mkfs.ext4", "blkid")
	dir := t.TempDir()
	paths := makeDisks(t, dir, 2, testDiskSize)
	ext4 := dir + "/ext4.img"
	sparse(t, ext4, 64<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", ext4).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	before := hashFile(t, ext4)

	p := openPool(t, configFor(append(paths, ext4)...))
	d := diskByPath(t, p, ext4)
	if d.Status != StatusRefused || !strings.Contains(d.Reason, "ext4 filesystem") || !strings.Contains(d.Reason, ext4) {
		t.Fatalf("ext4 disk at Open: %+v", d)
	}
	_, err := p.AddDisk(DiskConfig{Path: ext4})
	var se *SignatureError
	if !errors.Is(err, ErrForeignSignature) || !errors.As(err, &se) || se.Disk != ext4 || se.Found[0].Offset != 1080 {
		t.Fatalf("AddDisk of an ext4 disk: %v", err)
	}
	if hashFile(t, ext4) != before {
		t.Fatal("the refused ext4 disk was modified")
	}
	if blkidType(ext4) != "ext4" {
		t.Fatal("blkid no longer sees ext4")
	}

	// Wiped by hand (wipefs, or here: zeroes), then offered again: claimed, listed once.
	poke(t, ext4, 0, make([]byte, 1<<20))
	if d, err := p.AddDisk(DiskConfig{Path: ext4}); err != nil || d.Status != StatusActive {
		t.Fatalf("AddDisk after a wipe: %+v %v", d, err)
	}
	n := 0
	for _, d := range p.Disks() {
		if d.Path == ext4 {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("disk listed %d times: %+v", n, p.Disks())
	}
	p.Close()
	if err := os.Truncate(ext4, 0); err != nil { // start over for the wipe opt-in below
		t.Fatal(err)
	}
	sparse(t, ext4, 64<<20)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", ext4).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}

	// Explicit opt-in: wiped and claimed.
	cfg := configFor(paths...)
	cfg.Disks = append(cfg.Disks, DiskConfig{Path: ext4, Wipe: true})
	p = openPool(t, cfg)
	defer p.Close()
	if d := diskByPath(t, p, ext4); d.Status != StatusActive {
		t.Fatalf("wipe-enabled ext4 disk: %+v", d)
	}
	if sigs := detect(t, ext4); len(sigs) != 0 {
		t.Fatalf("after wipe: %v", sigs)
	}
}
