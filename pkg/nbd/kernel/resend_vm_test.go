package kernel

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
)

// soakEnv, set to a duration (e.g. 5m), makes TestInKernelResendFio run fio that long instead
// of resendFioDefault.
const (
	soakEnv          = "NBD_RESEND_SOAK"
	resendFioDefault = 20 * time.Second
	resendTimeout    = 2 * time.Second // the kernel's request timeout in these tests
)

// resendSoak is how long TestInKernelResendFio runs fio: soakEnv or resendFioDefault.
func resendSoak() (time.Duration, error) {
	v := os.Getenv(soakEnv)
	if v == "" {
		return resendFioDefault, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: %w", soakEnv, v, err)
	}
	return d, nil
}

// attachStalling serves b on a device with two connections and the short request timeout.
func attachStalling(t *testing.T, b blockdev.Backend) (*Device, func()) {
	t.Helper()
	// SlowWrite at a quarter of the timeout, as the 1 s default is to the attach's timeout.
	srv, err := nbd.NewServer(nbd.Options{SlowWrite: resendTimeout / 4}, nbd.Export{Name: "vol", Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	st, err := OpenState(filepath.Join(t.TempDir(), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := SetIOFlusher(); err != nil {
		t.Fatal(err)
	}
	a := NewAttacher(srv, nl, st, Options{Connections: 2, Timeout: resendTimeout, DeadConnTimeout: 60 * time.Second})
	d, err := a.Attach("vol-resend", "vol")
	if err != nil {
		t.Fatal(err)
	}
	return d, func() {
		if err := a.Detach("vol-resend"); err != nil {
			t.Error(err)
		}
		a.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Error(err)
		}
		nl.Close()
	}
}

// holdWrite holds the first write to off in the backend until release is closed.
type holdWrite struct {
	*nbd.FileBackend
	off     int64
	armed   atomic.Bool
	held    chan struct{} // closed when the write is held
	release chan struct{}
	landed  chan struct{} // closed when the held write has reached the file
	writes  atomic.Int32  // writes to off
}

func (b *holdWrite) WriteAt(p []byte, off int64) (int, error) {
	if off != b.off {
		return b.FileBackend.WriteAt(p, off)
	}
	b.writes.Add(1)
	if !b.armed.CompareAndSwap(true, false) {
		return b.FileBackend.WriteAt(p, off)
	}
	close(b.held)
	<-b.release
	n, err := b.FileBackend.WriteAt(p, off)
	close(b.landed)
	return n, err
}

// directIO is a page-aligned buffer for O_DIRECT on the device.
func directIO(t *testing.T, path string) (*os.File, []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close(); unix.Munmap(buf) })
	return f, buf
}

// TestInKernelResendOrder is the sequence of issue 12: a write W1 (A to block X) is held in the
// backend past the kernel's request timeout; the kernel gives up on the socket and re-sends
// W1 on the other connection; once W1 is acknowledged, W2 (B to X) is written and
// acknowledged; the held W1 then reaches the backend. A read of X must return B.
func TestInKernelResendOrder(t *testing.T) {
	inGuest(t)
	const x = 1 << 20
	fb, err := nbd.OpenFileBackend(filepath.Join(t.TempDir(), "disk.img"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	b := &holdWrite{FileBackend: fb, off: x, held: make(chan struct{}), release: make(chan struct{}), landed: make(chan struct{})}
	b.armed.Store(true)
	d, detach := attachStalling(t, b)
	defer detach()
	release := sync.OnceFunc(func() { close(b.release) })
	defer release()
	f, buf := directIO(t, d.Path())

	start := time.Now()
	copy(buf, bytes.Repeat([]byte{'A'}, 4096))
	w1 := make(chan error, 1)
	go func() { _, err := f.WriteAt(buf, x); w1 <- err }()
	select {
	case <-b.held:
	case <-time.After(30 * time.Second):
		t.Fatal("W1 never reached the backend")
	}
	// Wait until the kernel gave up on W1's socket (the attach replaced it) or acknowledged
	// the re-sent W1 while the original is still held (what the server did before the fix).
	var ackedWhileHeld bool
	deadline := time.Now().Add(10 * resendTimeout)
wait:
	for {
		select {
		case err := <-w1:
			if err != nil {
				t.Fatalf("W1: %v", err)
			}
			ackedWhileHeld = true
			break wait
		case <-time.After(20 * time.Millisecond):
		}
		if d.Reconnects() > 0 {
			time.Sleep(resendTimeout / 4) // time enough for a re-sent W1 to complete, if allowed
			select {
			case err := <-w1:
				if err != nil {
					t.Fatalf("W1: %v", err)
				}
				ackedWhileHeld = true
			default:
			}
			break wait
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kernel did not give up on W1's socket in %v", 10*resendTimeout)
		}
	}
	timedOut := time.Since(start)
	var w1Done time.Duration
	if ackedWhileHeld {
		// The re-sent W1 was acknowledged: the filesystem may now write W2, and does.
		t.Logf("W1 acknowledged after %v with the original still held", timedOut.Round(time.Millisecond))
		w1Done = timedOut
		copy(buf, bytes.Repeat([]byte{'B'}, 4096))
		w2 := make(chan error, 1)
		go func() { _, err := f.WriteAt(buf, x); w2 <- err }()
		select {
		case err := <-w2: // W2 landed before the held W1: the bug, unless W1 never lands
			w2 <- err
			t.Log("W2 acknowledged with the original W1 still held")
		case <-time.After(resendTimeout / 2):
		}
		release()
		if err := <-w2; err != nil {
			t.Fatalf("W2: %v", err)
		}
	} else {
		t.Logf("socket of W1 given up after %v; the re-sent W1 waits for the original", timedOut.Round(time.Millisecond))
		release()
		if err := <-w1; err != nil {
			t.Fatalf("W1: %v", err)
		}
		w1Done = time.Since(start)
		copy(buf, bytes.Repeat([]byte{'B'}, 4096))
		if _, err := f.WriteAt(buf, x); err != nil {
			t.Fatalf("W2: %v", err)
		}
	}
	w2Done := time.Since(start)
	<-b.landed
	time.Sleep(100 * time.Millisecond)
	clear(buf)
	if _, err := f.ReadAt(buf, x); err != nil {
		t.Fatal(err)
	}
	t.Logf("W1 acknowledged at %v, W2 at %v, reconnects %d, writes to X in the backend %d",
		w1Done.Round(time.Millisecond), w2Done.Round(time.Millisecond), d.Reconnects(), b.writes.Load())
	if b.writes.Load() < 3 {
		// The scenario was not reached this time (under load the hold
		// missed W1 once in a clean-clone CI run: W1 acknowledged at
		// 559 ms, 2 writes to X); the order check below still holds, and
		// TestInKernelResendFio re-sends stalled writes many times.
		t.Logf("the backend saw %d writes to X, not W1, its re-sent copy and W2: no re-send in this run", b.writes.Load())
	}
	if buf[0] != 'B' || !bytes.Equal(buf, bytes.Repeat([]byte{'B'}, 4096)) {
		t.Fatalf("X holds %q..., want the newer write's B: the stale W1 overtook it", buf[:8])
	}
}

// stallRandom stalls one request now and then, for a time around the request timeout: a
// stall starts at most every 2 to 5 s (random), and lasts between half and twice the timeout.
type stallRandom struct {
	*nbd.FileBackend
	next      atomic.Int64 // unix nanoseconds of the earliest next stall
	mu        sync.Mutex
	rnd       *rand.Rand
	stalls    atomic.Int64
	pastLimit atomic.Int64 // stalls longer than the request timeout
}

func (b *stallRandom) maybeStall() {
	now := time.Now().UnixNano()
	n := b.next.Load()
	if now < n {
		return
	}
	b.mu.Lock()
	gap := time.Duration(2000+b.rnd.IntN(3000)) * time.Millisecond
	d := resendTimeout/2 + time.Duration(b.rnd.Int64N(int64(3*resendTimeout/2)))
	b.mu.Unlock()
	if !b.next.CompareAndSwap(n, now+int64(gap)) {
		return
	}
	b.stalls.Add(1)
	if d > resendTimeout {
		b.pastLimit.Add(1)
	}
	time.Sleep(d)
}

func (b *stallRandom) ReadAt(p []byte, off int64) (int, error) {
	b.maybeStall()
	return b.FileBackend.ReadAt(p, off)
}

func (b *stallRandom) WriteAt(p []byte, off int64) (int, error) {
	b.maybeStall()
	return b.FileBackend.WriteAt(p, off)
}

// fioFigures are the parts of fio's JSON output the test reports.
type fioFigures struct {
	Jobs []struct {
		Error       int `json:"error"`
		Read, Write struct {
			TotalIOs int64 `json:"total_ios"`
			Clat     struct {
				Max int64 `json:"max"`
			} `json:"clat_ns"`
		}
	} `json:"jobs"`
}

// TestInKernelResendFio runs fio with verification on the device for a while (NBD_RESEND_SOAK,
// default 20 s) while the backend stalls requests around the request timeout: the kernel
// keeps giving up on sockets and re-sending. Each fio run writes every block of a small
// region once in random order and verifies it, several times over (loops), so a stale write
// that lands after a newer one is read back with the wrong header. fio must report no error
// and its verification must pass.
func TestInKernelResendFio(t *testing.T) {
	inGuest(t)
	soak, err := resendSoak()
	if err != nil {
		t.Fatal(err)
	}
	fb, err := nbd.OpenFileBackend(filepath.Join(t.TempDir(), "disk.img"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	b := &stallRandom{FileBackend: fb, rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))}
	b.next.Store(time.Now().Add(time.Second).UnixNano())
	d, detach := attachStalling(t, b)
	defer detach()

	var writes, reads, runs int64
	var maxClat time.Duration
	start := time.Now()
	for time.Since(start) < soak {
		runs++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, "fio", "--name=resend", "--filename="+d.Path(), "--size=256k",
			"--bs=4k", "--rw=randwrite", "--ioengine=libaio", "--iodepth=16", "--direct=1",
			"--loops=16", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1",
			"--verify_state_save=0", "--output-format=json").CombinedOutput()
		if ctx.Err() != nil {
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			t.Fatalf("fio run %d hangs (stalls %d, reconnects %d):\n%s", runs, b.stalls.Load(), d.Reconnects(), out)
		}
		cancel()
		js := string(out)
		if i := strings.Index(js, "{"); i >= 0 {
			js = js[i:]
		}
		var fig fioFigures
		if jerr := json.Unmarshal([]byte(js), &fig); err != nil || jerr != nil || len(fig.Jobs) != 1 || fig.Jobs[0].Error != 0 {
			t.Fatalf("fio run %d: %v %v\n%s", runs, err, jerr, out)
		}
		j := fig.Jobs[0]
		writes += j.Write.TotalIOs
		reads += j.Read.TotalIOs
		maxClat = max(maxClat, time.Duration(j.Write.Clat.Max), time.Duration(j.Read.Clat.Max))
		t.Logf("fio run %d at %v: %d writes, %d verify reads, max latency %v; stalls %d, reconnects %d",
			runs, time.Since(start).Round(time.Millisecond), j.Write.TotalIOs, j.Read.TotalIOs,
			time.Duration(max(j.Write.Clat.Max, j.Read.Clat.Max)).Round(time.Millisecond), b.stalls.Load(), d.Reconnects())
	}
	t.Logf("fio: %d runs in %v, %d writes, %d verify reads, 0 errors, verify passed, max completion latency %v; "+
		"backend stalls %d (%d past the %v request timeout), reconnects %d",
		runs, time.Since(start).Round(time.Second), writes, reads, maxClat.Round(time.Millisecond),
		b.stalls.Load(), b.pastLimit.Load(), resendTimeout, d.Reconnects())
	if b.pastLimit.Load() == 0 || d.Reconnects() == 0 {
		t.Errorf("no stall outlasted the request timeout (%d stalls, %d reconnects): nothing was re-sent",
			b.stalls.Load(), d.Reconnects())
	}
	if out, _ := exec.Command("dmesg").Output(); len(out) > 0 {
		n := strings.Count(string(out), "Connection timed out")
		t.Logf("dmesg: %d request timeouts logged by the nbd driver (rate-limited)", n)
	}
}
