package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

// The in-guest tests run as root in a QEMU guest (test/vm) whose kernel has nbd. On the host
// they skip; TestKernelVM runs them in the guest.

const helperEnv = "NBD_KERNEL_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "serve":
		os.Exit(serveHelper())
	case "leak":
		os.Exit(leakHelper())
	case "reclaim":
		os.Exit(reclaimHelper())
	case "owner":
		os.Exit(ownerHelper())
	}
	os.Exit(m.Run())
}

// TestKernelVM boots the VM and runs the TestInKernel* tests of this package there (but
// TestInKernelBench, the guest half of BenchmarkKernelVM); each must pass there. The
// re-send tests (TestInKernelResend*: a real /dev/nbdX with two connections and a short
// request timeout, over backends that stall requests past it, so that the kernel gives up
// on sockets and re-sends their requests on the other connection) share the boot; they had
// one of their own (issue 24). NBD_RESEND_SOAK (a duration) lengthens their fio run.
func TestKernelVM(t *testing.T) {
	vm.HostHalf(t)
	soak, err := resendSoak()
	if err != nil {
		t.Fatal(err)
	}
	limit := 8*time.Minute + soak
	vm.RunGoTestOpts(t, vm.Options{Timeout: limit, Memory: 2048, Env: []string{soakEnv + "=" + soak.String()},
		Tests: []string{"TestInKernelResize", "TestInKernelAttach", "TestInKernelKill9", "TestInKernelStaleRecord",
			"TestInKernelResendOrder", "TestInKernelResendFio"}},
		".", "-test.run=^TestInKernel", "-test.skip=^TestInKernelBench$", "-test.v",
		"-test.timeout="+(limit-time.Minute).String())
}

func inGuest(t *testing.T) {
	t.Helper()
	vm.GuestHalf(t, "TestKernelVM")
}

// countingBackend counts what reaches a file backend.
type countingBackend struct {
	*nbd.FileBackend
	flushes, discards, fua atomic.Int64
	maxRead, maxWrite      atomic.Int64 // the largest read and write, in bytes
}

func (b *countingBackend) ReadAt(p []byte, off int64) (int, error) {
	storeMax(&b.maxRead, int64(len(p)))
	return b.FileBackend.ReadAt(p, off)
}

func (b *countingBackend) WriteAt(p []byte, off int64) (int, error) {
	storeMax(&b.maxWrite, int64(len(p)))
	return b.FileBackend.WriteAt(p, off)
}

func storeMax(m *atomic.Int64, v int64) {
	for old := m.Load(); v > old && !m.CompareAndSwap(old, v); old = m.Load() {
	}
}

func (b *countingBackend) Flush() error { b.flushes.Add(1); return b.FileBackend.Flush() }
func (b *countingBackend) Discard(off, n int64) error {
	b.discards.Add(1)
	return b.FileBackend.Discard(off, n)
}
func (b *countingBackend) WriteAtFUA(p []byte, off int64) (int, error) {
	b.fua.Add(1)
	return b.FileBackend.WriteAtFUA(p, off)
}

// verifyJob is fio writing size bytes of file with verification.
func verifyJob(file, size string, extra ...string) vm.FioJob {
	return vm.FioJob{Name: "verify", File: file, Size: size, Extra: extra}
}

// TestInKernelAttach attaches a file over netlink with two connections, puts ext4 and xfs on
// it, runs fio with verification, and checks that fsync arrives as FLUSH and fstrim as TRIM.
func TestInKernelAttach(t *testing.T) {
	inGuest(t)
	dir := t.TempDir()
	fb, err := nbd.OpenFileBackend(filepath.Join(dir, "disk.img"), 512<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	cb := &countingBackend{FileBackend: fb}
	srv, err := nbd.NewServer(nbd.Options{}, nbd.Export{Name: "vol", Backend: cb})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	st, err := OpenState(filepath.Join(dir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := SetIOFlusher(); err != nil {
		t.Fatal(err)
	}
	a := NewAttacher(srv, nl, st, Options{Connections: 2, Timeout: 10 * time.Second, DeadConnTimeout: 60 * time.Second})
	d, err := a.Attach("vol-attach", "vol")
	if err != nil {
		t.Fatal(err)
	}
	if d.Reattached {
		t.Fatal("fresh attach reported as reattach")
	}
	status, err := nl.Status(int(d.Index))
	if err != nil || len(status) != 1 || !status[0].Connected {
		t.Fatalf("status %+v %v", status, err)
	}
	if id, _ := BackendOf(d.Index); id != "raid10-csi:vol-attach" {
		t.Fatalf("backend %q", id)
	}
	// Recorded: the owner file no longer lists the volume as being connected.
	if s, err := scanOwners(filepath.Join(dir, OwnersDir)); err != nil || s.of("vol-attach") != connectorUnlisted {
		t.Fatalf("after the attach the owner files give %v (%v), want the volume unlisted", s, err)
	}
	if rec, ok := st.Get("vol-attach"); !ok || rec.Index != d.Index {
		t.Fatalf("state %+v %v", rec, ok)
	}

	t.Run("a 1 MiB request arrives whole", func(t *testing.T) {
		q := fmt.Sprintf("/sys/block/nbd%d/queue/", d.Index)
		if got := strings.TrimSpace(vm.Sh(t, "cat", q+"max_sectors_kb")); got != strconv.Itoa(DefaultMaxRequestKiB) {
			t.Fatalf("max_sectors_kb %s, want %d", got, DefaultMaxRequestKiB)
		}
		if got := vm.Sh(t, "cat", q+"scheduler"); !strings.Contains(got, "[none]") {
			t.Fatalf("scheduler %q, want none", got)
		}
		vm.Sh(t, "dd", "if=/dev/urandom", "of="+d.Path(), "bs=1M", "count=4", "oflag=direct", "status=none")
		vm.Sh(t, "dd", "if="+d.Path(), "of=/dev/null", "bs=1M", "count=4", "iflag=direct", "status=none")
		if r, w := cb.maxRead.Load(), cb.maxWrite.Load(); r != 1<<20 || w != 1<<20 {
			t.Fatalf("largest request the server saw: read %d, write %d bytes; want 1 MiB each", r, w)
		}
	})

	t.Run("device already configured is never taken", func(t *testing.T) {
		s, k, err := socketPair()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		defer k.Close()
		_, err = nl.Connect(int(d.Index), Config{Size: 1 << 20, Sockets: []*os.File{k}})
		if !errors.Is(err, syscall.EBUSY) {
			t.Fatalf("CONNECT on nbd%d: %v, want EBUSY", d.Index, err)
		}
		err = nl.Reconfigure(d.Index, Config{BackendID: "someone-else", Sockets: []*os.File{k}})
		if !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("RECONFIGURE with a foreign backend: %v, want EINVAL", err)
		}
	})

	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, fs := range []struct{ name, mkfs, force string }{{"ext4", "mkfs.ext4", "-F"}, {"xfs", "mkfs.xfs", "-f"}} {
		t.Run(fs.name, func(t *testing.T) {
			vm.Sh(t, fs.mkfs, "-q", fs.force, d.Path())
			vm.Sh(t, "mount", d.Path(), mnt)
			defer vm.Sh(t, "umount", mnt)
			vm.FioVerify(t, verifyJob(filepath.Join(mnt, "fio.dat"), "16M"))

			before := cb.flushes.Load()
			vm.Sh(t, "dd", "if=/dev/zero", "of="+filepath.Join(mnt, "x"), "bs=4k", "count=16", "conv=fsync", "status=none")
			if cb.flushes.Load() == before {
				t.Fatal("fsync did not reach the backend as FLUSH")
			}
			before = cb.discards.Load()
			if err := os.Remove(filepath.Join(mnt, "fio.dat")); err != nil {
				t.Fatal(err)
			}
			vm.Sh(t, "sync")
			vm.Sh(t, "fstrim", "-v", mnt)
			if cb.discards.Load() == before {
				t.Fatal("fstrim did not reach the backend as TRIM")
			}
			t.Logf("%s: backend saw %d flushes, %d discards, %d FUA writes so far",
				fs.name, cb.flushes.Load(), cb.discards.Load(), cb.fua.Load())
		})
	}

	t.Run("a broken connection is replaced", func(t *testing.T) {
		d.mu.Lock()
		for c := range d.live {
			_ = c.Close() // as if this connection had failed
			break
		}
		d.mu.Unlock()
		vm.FioVerify(t, verifyJob(d.Path(), "8M"))
		deadline := time.Now().Add(30 * time.Second)
		for d.Reconnects() == 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if d.Reconnects() == 0 {
			t.Fatal("the connection was not replaced")
		}
		d.mu.Lock()
		n := len(d.live)
		d.mu.Unlock()
		if n != 2 {
			t.Fatalf("%d connections served after the replacement", n)
		}
		vm.FioVerify(t, verifyJob(d.Path(), "8M", "--offset=16M"))
	})

	if err := a.Detach("vol-attach"); err != nil {
		t.Fatal(err)
	}
	status, err = nl.Status(int(d.Index))
	if err != nil || len(status) != 1 || status[0].Connected {
		t.Fatalf("after detach: status %+v %v", status, err)
	}
	if _, ok := st.Get("vol-attach"); ok {
		t.Fatal("detached volume still recorded")
	}
	if err := a.Detach("vol-attach"); err != nil {
		t.Fatalf("second detach: %v", err)
	}
}

// startHelper starts the serving process of TestInKernelKill9 (the test binary run again)
// and returns it with its device and whether it reattached that device.
func startHelper(t *testing.T, dir string) (p *vm.Proc, dev string, reattached bool) {
	t.Helper()
	p = vm.StartSelf(t, 60*time.Second, helperEnv+"=serve", "NBD_HELPER_DIR="+dir)
	var how string
	fmt.Sscanf(p.Ready, "READY %s %s", &dev, &how)
	return p, dev, how == "reattached"
}

// serveHelper serves a file on a device for TestInKernelKill9 until SIGTERM, then detaches.
func serveHelper() int {
	dir := os.Getenv("NBD_HELPER_DIR")
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "helper:", err); return 1 }
	if err := SetIOFlusher(); err != nil {
		return fail(err)
	}
	fb, err := nbd.OpenFileBackend(filepath.Join(dir, "disk.img"), 0)
	if err != nil {
		return fail(err)
	}
	srv, err := nbd.NewServer(nbd.Options{}, nbd.Export{Name: "vol", Backend: fb})
	if err != nil {
		return fail(err)
	}
	nl, err := Dial()
	if err != nil {
		return fail(err)
	}
	st, err := OpenState(filepath.Join(dir, "state.json"))
	if err != nil {
		return fail(err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	a := NewAttacher(srv, nl, st, Options{Connections: 2, Timeout: 5 * time.Second, DeadConnTimeout: 60 * time.Second})
	d, err := a.Attach("vol-kill9", "vol")
	if err != nil {
		return fail(err)
	}
	how := "attached"
	if d.Reattached {
		how = "reattached"
	}
	fmt.Printf("READY %s %s\n", d.Path(), how)
	<-term
	if err := a.Detach("vol-kill9"); err != nil {
		return fail(err)
	}
	a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return fail(err)
	}
	fmt.Printf("DETACHED reconnects=%d\n", d.Reconnects())
	return 0
}

// TestInKernelKill9 is the restart test: fio writes with verification through ext4 on the
// device while the serving process is killed with SIGKILL and started again, several times;
// the new process reattaches with NBD_CMD_RECONFIGURE. fio must finish without an error,
// its verification must pass, and e2fsck must find the filesystem clean.
func TestInKernelKill9(t *testing.T) {
	inGuest(t)
	const kills = 4
	dir := t.TempDir()
	vm.SparseFile(t, filepath.Join(dir, "disk.img"), 128<<20)
	h, dev, reattached := startHelper(t, dir)
	t.Cleanup(func() { h.Kill() })
	if reattached {
		t.Fatal("first start reported a reattach")
	}
	mnt := filepath.Join(dir, "mnt")
	vm.MkfsExt4(t, dev)
	umount := vm.Mount(t, dev, mnt)

	// 24 MiB at a bounded rate: about 12 s of writes, then the verification reads.
	job := vm.FioJob{Name: "kill9", File: filepath.Join(mnt, "fio.dat"), Size: "24M", IODepth: 8, RateIOPS: 500}
	vm.FioUnderKills(t, job, kills, 2*time.Second, func(i int, into time.Duration) {
		h.Kill()
		t.Logf("kill %d: SIGKILL at %s into fio", i+1, into)
		var again string
		h, again, reattached = startHelper(t, dir)
		if !reattached || again != dev {
			t.Fatalf("restart %d: %s reattached=%v, want %s reattached", i+1, again, reattached, dev)
		}
	})
	umount()
	vm.Sh(t, "e2fsck", "-fn", dev)
	vm.LogDmesg(t, "nbd", "I/O error", "EXT4-fs error")

	// Clean detach: the helper disconnects on SIGTERM.
	rest, err := h.Stop()
	if err != nil || !strings.Contains(strings.Join(rest, "\n"), "DETACHED") {
		t.Fatalf("helper detach: %v %q", err, rest)
	}
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	var idx uint32
	fmt.Sscanf(dev, "/dev/nbd%d", &idx)
	if s, err := nl.Status(int(idx)); err != nil || len(s) != 1 || s[0].Connected {
		t.Fatalf("after detach: %+v %v", s, err)
	}
}
