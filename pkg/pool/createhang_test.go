package pool

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// stallOnWrite stalls its member at its first WriteAt (the engine's metadata; the pool's
// zeroing is WriteZeroes), so that the member hangs inside raid10.Create.
type stallOnWrite struct {
	faultyExtent
	once atomic.Bool
}

func (s *stallOnWrite) WriteAt(p []byte, off int64) (int, error) {
	if s.once.CompareAndSwap(false, true) {
		s.Stall()
	}
	return s.faultyExtent.WriteAt(p, off)
}

// inflight counts the calls inside a member, so that the test can wait for the calls a
// failed create abandoned before it closes the pool's files.
type inflight struct {
	raid10.Member
	n atomic.Int32
}

func (c *inflight) WriteAt(p []byte, off int64) (int, error) {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Member.WriteAt(p, off)
}

func (c *inflight) WriteZeroes(off, n int64) error {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Member.WriteZeroes(off, n)
}

func (c *inflight) Flush() error {
	c.n.Add(1)
	defer c.n.Add(-1)
	return c.Member.Flush()
}

// TestCreateVolumeHungDisk: a disk that hangs while a volume is created (zeroing its
// extent, or in the engine's metadata writes) makes CreateVolume fail within the member
// deadline with an error matching EIO, instead of hanging with the pool's lock held; the
// disk is failed (no new extent goes to it while its abandoned writes may land), no
// extent of the volume is left in any label, and the name can be created again on the
// other disks. Without the bounds CreateVolume hangs until the disk answers.
func TestCreateVolumeHungDisk(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stall func(f faultyExtent) raid10.Member // wraps the second member created
	}{
		{"hangs zeroing", func(f faultyExtent) raid10.Member { f.Stall(); return f }},
		{"hangs in the engine's metadata write", func(f faultyExtent) raid10.Member { return &stallOnWrite{faultyExtent: f} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := configFor(makeDisks(t, t.TempDir(), 3, testDiskSize)...)
			c.MemberTimeout = Duration(time.Second) // not less: a loaded machine under -race passes 100 ms on healthy disks
			p := openPool(t, c)
			var fs []*raid10.FaultyMember
			hung := &inflight{}
			p.mu.Lock()
			p.wrapMember = func(m raid10.Member) raid10.Member {
				f := faultyExtent{raid10.NewFaultyMember(m), m.(*raid10.ExtentMember)}
				fs = append(fs, f.FaultyMember)
				if len(fs) == 2 {
					hung.Member = tc.stall(f)
					return hung
				}
				return f
			}
			p.mu.Unlock()
			unstall := func() {
				for _, f := range fs {
					f.Unstall()
				}
			}
			defer p.Close()
			defer func() {
				unstall()
				for i := 0; hung.n.Load() != 0 && i < 1000; i++ {
					time.Sleep(10 * time.Millisecond)
				}
			}()
			done := make(chan error, 1)
			go func() {
				_, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2})
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				unstall()
				<-done
				t.Fatal("CreateVolume hung on a hung disk")
			}
			if !errors.Is(err, syscall.EIO) {
				t.Fatalf("CreateVolume: %v, want an error matching EIO", err)
			}
			t.Logf("refused: %v", err)
			p.mu.Lock()
			p.wrapMember = nil
			var failed []string
			for _, d := range p.disks {
				if d.state == DiskFailed {
					failed = append(failed, d.path)
				}
				for _, x := range d.label.Extents {
					t.Errorf("disk %s: extent of volume %q (flags %#x) left after the failed create", d.path, x.Name, x.Flags)
				}
			}
			p.mu.Unlock()
			if len(failed) != 1 {
				t.Fatalf("failed disks %v, want the hung one", failed)
			}
			if vs := p.Volumes(); len(vs) != 0 {
				t.Fatalf("volumes %+v after the failed create", vs)
			}
			if _, err := p.CreateVolume("v", 16<<20, CreateOptions{Members: 2}); err != nil {
				t.Fatalf("CreateVolume again on the healthy disks: %v", err)
			}
			p.mu.Lock()
			for _, d := range p.disks {
				if d.state == DiskFailed && len(d.label.Extents) != 0 {
					t.Errorf("failed disk %s got an extent", d.path)
				}
			}
			p.mu.Unlock()
		})
	}
}

// slowZeroes answers every WriteZeroes after a delay: a disk that writes zeroes itself.
type slowZeroes struct {
	raid10.Member
	delay time.Duration
}

func (s slowZeroes) WriteZeroes(off, n int64) error {
	time.Sleep(s.delay)
	return s.Member.WriteZeroes(off, n)
}

// TestCreateVolumeSlowZeroing: zeroing a new extent that takes longer than the member
// deadline in all, on disks whose every zeroing call answers within it, is progress, not a
// hang: the create succeeds and no disk is failed.
func TestCreateVolumeSlowZeroing(t *testing.T) {
	c := configFor(makeDisks(t, t.TempDir(), 2, testDiskSize)...)
	c.MemberTimeout = Duration(time.Second)
	p := openPool(t, c)
	defer p.Close()
	p.mu.Lock()
	p.wrapMember = func(m raid10.Member) raid10.Member { return slowZeroes{m, 400 * time.Millisecond} }
	p.mu.Unlock()
	start := time.Now()
	const size = 3 * zeroStep // an extent of four zeroing calls: 1.6 s
	if _, err := p.CreateVolume("v", size, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Duration(c.MemberTimeout) {
		t.Fatalf("create took %v: the zeroing was not slower than the deadline, the test shows nothing", took)
	}
	for _, d := range p.Disks() {
		if d.Status != StatusActive {
			t.Fatalf("disk %s %s after a slow zeroing: %s", d.Path, d.Status, d.Reason)
		}
	}
}
