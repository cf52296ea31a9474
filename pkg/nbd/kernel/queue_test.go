package kernel

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeQueue makes a sysfs-like queue directory for nbd<index> under a temporary sysBlock.
// The files are plain files: what TuneQueue writes replaces their content, so the test sees
// exactly what it wrote (the kernel side is TestInKernelAttach's).
func fakeQueue(t *testing.T, index int, hw, cur, sched string) string {
	t.Helper()
	old := sysBlock
	sysBlock = t.TempDir()
	t.Cleanup(func() { sysBlock = old })
	q := filepath.Join(sysBlock, "nbd"+strconv.Itoa(index), "queue")
	if err := os.MkdirAll(q, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"max_hw_sectors_kb": hw, "max_sectors_kb": cur, "scheduler": sched} {
		if err := os.WriteFile(filepath.Join(q, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

func TestTuneQueue(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hw, maxKiB int
		want       string // max_sectors_kb afterwards
	}{
		{"raised to the knob", 32768, 1024, "1024"},
		{"capped by the driver", 512, 1024, "512"},
		{"left alone", 32768, -1, "128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := fakeQueue(t, 3, strconv.Itoa(tc.hw), "128", "[mq-deadline] none")
			s, err := TuneQueue(3, tc.maxKiB)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(filepath.Join(q, "max_sectors_kb"))
			if strings.TrimSpace(string(got)) != tc.want || strconv.Itoa(s.MaxSectorsKiB) != tc.want {
				t.Fatalf("max_sectors_kb %q, reported %d, want %s", got, s.MaxSectorsKiB, tc.want)
			}
			if got, _ := os.ReadFile(filepath.Join(q, "scheduler")); string(got) != "none" || s.Scheduler != "none" {
				t.Fatalf("scheduler file %q, reported %q, want none", got, s.Scheduler)
			}
			if s.MaxHWSectorsKiB != tc.hw {
				t.Fatalf("max_hw_sectors_kb reported %d, want %d", s.MaxHWSectorsKiB, tc.hw)
			}
		})
	}
	t.Run("no such device names the file", func(t *testing.T) {
		fakeQueue(t, 1, "32768", "128", "none")
		_, err := TuneQueue(7, 1024)
		if err == nil || !strings.Contains(err.Error(), "nbd7/queue/max_hw_sectors_kb") {
			t.Fatalf("err %v, want one naming nbd7/queue/max_hw_sectors_kb", err)
		}
	})
}

func TestScheduler(t *testing.T) {
	p := filepath.Join(t.TempDir(), "scheduler")
	for in, want := range map[string]string{"mq-deadline kyber [none]\n": "none", "[mq-deadline] none": "mq-deadline", "none\n": "none"} {
		if err := os.WriteFile(p, []byte(in), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := scheduler(p); err != nil || got != want {
			t.Fatalf("scheduler(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestSocketPairBuffers: both ends of an attach's socket pair get a send buffer of
// socketBuffer (the kernel reports twice what was set), or the most the host allows
// without CAP_NET_ADMIN.
func TestSocketPairBuffers(t *testing.T) {
	s, k, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer k.Close()
	limit := socketBuffer
	if os.Geteuid() != 0 {
		b, err := os.ReadFile("/proc/sys/net/core/wmem_max")
		if err != nil {
			t.Fatal(err)
		}
		if m, _ := strconv.Atoi(strings.TrimSpace(string(b))); m < limit {
			limit = m
		}
	}
	got, err := unix.GetsockoptInt(int(k.Fd()), unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		t.Fatal(err)
	}
	if got < 2*limit {
		t.Fatalf("kernel end: SO_SNDBUF %d, want %d", got, 2*limit)
	}
	raw, err := s.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { got, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if got < 2*limit {
		t.Fatalf("server end: SO_SNDBUF %d, want %d", got, 2*limit)
	}
}
