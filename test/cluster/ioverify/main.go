// Command ioverify is the workload of the cluster story (test/cluster): in a pod, it writes
// a file or a block device in rounds with O_DIRECT and verifies every block, as fio's
// --verify does, and reports each round, every I/O error and the longest single I/O (the
// stall a node plugin restart or a disk failure causes). fio itself is not used because
// Debian's fio links the Ceph and Gluster libraries (an image of 100 MB more); this static
// binary goes into an image of its own (raid10-csi/ioverify).
//
// Each block of -bs bytes holds a header (magic, block index, round, CRC-32C of the rest)
// and a payload derived from (index, round); with -marker, the payload starts with that
// string, which a test can look for on the raw disks (the story's encrypted claim: issue 27). A round writes every block, fsyncs, then reads
// every block back and checks it. At start, a target that already holds rounds (a pod
// restarted after a node reboot) is verified first: every block must be intact and hold the
// last complete round or the one after it (cut short).
//
// Output lines (the test parses them):
//
//	resume round R: N blocks ok (rounds M..R) | resume: empty
//	HH:MM:SS.mmm round R ok: write Dms read Dms max-io Dms errors E  (max-io: the longest I/O of the round)
//	ERROR <what>
//	STATS rounds=N errors=E max-io-ms=M
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"os/signal"
	"syscall"
	"time"
	"unsafe"
)

const (
	magic  = 0x52313056 // "R10V"
	header = 24
)

var (
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
	// marker starts every block's payload (-marker).
	marker []byte
)

func main() {
	path := flag.String("path", "", "file or block device to write")
	size := flag.Int64("size", 16<<20, "bytes to use (a file is created this large)")
	bs := flag.Int("bs", 4096, "block size (a multiple of 512)")
	rounds := flag.Int("rounds", 0, "stop after this many rounds (0: until SIGTERM)")
	pause := flag.Duration("pause", 0, "sleep between rounds")
	mark := flag.String("marker", "", "a string every block's payload starts with")
	flag.Parse()
	if *path == "" || *bs%512 != 0 || *bs < 512 || *size < int64(*bs) || header+len(*mark) > *bs {
		fmt.Fprintln(os.Stderr, "ioverify: -path is required, -bs a multiple of 512, -size at least -bs, -marker shorter than a block")
		os.Exit(2)
	}
	marker = []byte(*mark)
	os.Exit(run(*path, *size, *bs, *rounds, *pause))
}

func run(path string, size int64, bs, rounds int, pause time.Duration) int {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o644)
	if err != nil {
		fmt.Printf("ERROR open %s: %v\n", path, err)
		return 1
	}
	defer func() { _ = f.Close() }()
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() && st.Size() < size {
		if err := f.Truncate(size); err != nil {
			fmt.Printf("ERROR truncate: %v\n", err)
			return 1
		}
	}
	n := size / int64(bs)
	buf := alignedBuf(bs)
	errs, maxIO, roundMax := 0, time.Duration(0), time.Duration(0)
	timed := func(op func() error) error {
		t := time.Now()
		err := op()
		d := time.Since(t)
		maxIO = max(maxIO, d)
		roundMax = max(roundMax, d)
		return err
	}

	// Resume: every block holds round m or m+1 (a round m+1 cut short by a crash or a kill;
	// round m was complete and fsynced), or the target is empty.
	round, hi := uint64(0), uint64(0)
	for i := int64(0); i < n; i++ {
		if _, err := f.ReadAt(buf, i*int64(bs)); err != nil {
			fmt.Printf("ERROR resume read block %d: %v\n", i, err)
			errs++
			break
		}
		if binary.LittleEndian.Uint32(buf) != magic {
			if i == 0 {
				break
			}
			fmt.Printf("ERROR resume: block %d has no header (blocks before it do)\n", i)
			errs++
			break
		}
		r, err := check(buf, i)
		if err != nil {
			fmt.Printf("ERROR resume: %v\n", err)
			errs++
			break
		}
		if i == 0 {
			round, hi = r, r
		}
		round, hi = min(round, r), max(hi, r)
		if hi-round > 1 {
			fmt.Printf("ERROR resume: block %d holds round %d, others rounds %d..%d\n", i, r, round, hi)
			errs++
			break
		}
		if i == n-1 {
			fmt.Printf("resume round %d: %d blocks ok (rounds %d..%d)\n", hi, n, round, hi)
		}
	}
	round = hi
	if round == 0 && errs == 0 {
		fmt.Println("resume: empty")
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	for done := 0; rounds == 0 || done < rounds; done++ {
		select {
		case <-stop:
			fmt.Printf("STATS rounds=%d errors=%d max-io-ms=%d\n", done, errs, maxIO.Milliseconds())
			return exitCode(errs)
		default:
		}
		round++
		roundMax = 0
		t0 := time.Now()
		for i := int64(0); i < n; i++ {
			fill(buf, i, round)
			if err := timed(func() error { _, err := f.WriteAt(buf, i*int64(bs)); return err }); err != nil {
				fmt.Printf("ERROR write round %d block %d: %v\n", round, i, err)
				errs++
			}
		}
		if err := timed(f.Sync); err != nil {
			fmt.Printf("ERROR fsync round %d: %v\n", round, err)
			errs++
		}
		t1 := time.Now()
		for i := int64(0); i < n; i++ {
			if err := timed(func() error { _, err := f.ReadAt(buf, i*int64(bs)); return err }); err != nil {
				fmt.Printf("ERROR read round %d block %d: %v\n", round, i, err)
				errs++
				continue
			}
			if r, err := check(buf, i); err != nil || r != round {
				fmt.Printf("ERROR verify round %d block %d: round %d, %v\n", round, i, r, err)
				errs++
			}
		}
		fmt.Printf("%s round %d ok: write %dms read %dms max-io %dms errors %d\n", time.Now().UTC().Format("15:04:05.000"), round,
			t1.Sub(t0).Milliseconds(), time.Since(t1).Milliseconds(), roundMax.Milliseconds(), errs)
		if pause > 0 {
			time.Sleep(pause)
		}
	}
	fmt.Printf("STATS rounds=%d errors=%d max-io-ms=%d\n", rounds, errs, maxIO.Milliseconds())
	return exitCode(errs)
}

func exitCode(errs int) int {
	if errs > 0 {
		return 1
	}
	return 0
}

// fill writes block i of round r into buf.
func fill(buf []byte, i int64, r uint64) {
	binary.LittleEndian.PutUint32(buf[0:], magic)
	binary.LittleEndian.PutUint64(buf[8:], uint64(i))
	binary.LittleEndian.PutUint64(buf[16:], r)
	x := uint64(i)*0x9E3779B97F4A7C15 ^ r
	for o := header; o+8 <= len(buf); o += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[o:], x)
	}
	copy(buf[header:], marker)
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(buf[8:], castagnoli))
}

// check verifies block i in buf and returns its round.
func check(buf []byte, i int64) (uint64, error) {
	if binary.LittleEndian.Uint32(buf) != magic {
		return 0, errors.New("bad magic")
	}
	if got := binary.LittleEndian.Uint64(buf[8:]); got != uint64(i) {
		return 0, fmt.Errorf("block %d holds block %d", i, got)
	}
	if crc32.Checksum(buf[8:], castagnoli) != binary.LittleEndian.Uint32(buf[4:]) {
		return 0, fmt.Errorf("block %d: checksum mismatch", i)
	}
	return binary.LittleEndian.Uint64(buf[16:]), nil
}

// alignedBuf returns a buffer of n bytes aligned to 4096 for O_DIRECT.
func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	if off == 4096 {
		off = 0
	}
	return b[off : off+n]
}
