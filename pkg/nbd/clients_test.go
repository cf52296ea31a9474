package nbd

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(needBinary(t, name), args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestNbdinfo checks the advertised flags as libnbd sees them.
func TestNbdinfo(t *testing.T) {
	needBinary(t, "nbdinfo")
	_, e := fileExport(t, 16<<20)
	e.Description = "raid10 volume"
	_, sock := startServer(t, Options{}, e)
	var info struct {
		Protocol string `json:"protocol"`
		Exports  []struct {
			Size        int64  `json:"export-size"`
			Description string `json:"description"`
			ReadOnly    bool   `json:"is_read_only"`
			Flush       bool   `json:"can_flush"`
			FUA         bool   `json:"can_fua"`
			Trim        bool   `json:"can_trim"`
			Zero        bool   `json:"can_zero"`
			MultiConn   bool   `json:"can_multi_conn"`
			Minimum     int    `json:"block_size_minimum"`
			Preferred   int    `json:"block_size_preferred"`
			Maximum     int    `json:"block_size_maximum"`
		} `json:"exports"`
	}
	out := run(t, "nbdinfo", "--json", uri(sock))
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(info.Exports) != 1 {
		t.Fatalf("exports: %s", out)
	}
	x := info.Exports[0]
	if info.Protocol != "newstyle-fixed" || x.Size != 16<<20 || x.ReadOnly || !x.Flush || !x.FUA ||
		!x.Trim || !x.Zero || !x.MultiConn || x.Description != "raid10 volume" ||
		x.Minimum != 1 || x.Preferred != 4096 || x.Maximum != DefaultMaxRequestSize {
		t.Fatalf("nbdinfo: %+v\n%s", x, out)
	}
	list := run(t, "nbdinfo", "--list", "--json", uri(sock))
	if !strings.Contains(list, `"export-name": ""`) {
		t.Fatalf("nbdinfo --list: %s", list)
	}
}

// TestQemuIO writes, reads back, zeroes, discards and flushes with qemu's NBD client, and
// checks that the flushes and discards reach the backend.
func TestQemuIO(t *testing.T) {
	needBinary(t, "qemu-io")
	cb, e := fileExport(t, 16<<20)
	_, sock := startServer(t, Options{}, e)
	out := run(t, "qemu-io", "-f", "raw",
		"-c", "write -P 0xab 0 1M",
		"-c", "write -P 0xcd -f 1M 64k", // FUA
		"-c", "read -P 0xab 0 1M",
		"-c", "read -P 0xcd 1M 64k",
		"-c", "write -z 2M 128k",
		"-c", "read -P 0 2M 128k",
		"-c", "discard 0 64k",
		"-c", "read -P 0 0 64k",
		"-c", "read -P 0xab 64k 64k",
		"-c", "flush",
		uri(sock))
	if strings.Contains(out, "Pattern verification failed") || strings.Contains(out, "error") {
		t.Fatalf("qemu-io:\n%s", out)
	}
	if cb.flushes.Load() == 0 || cb.discards.Load() == 0 || cb.fuaWrites.Load() == 0 || cb.zeroes.Load() == 0 {
		t.Fatalf("backend saw %d flushes, %d discards, %d FUA writes, %d zeroes\n%s",
			cb.flushes.Load(), cb.discards.Load(), cb.fuaWrites.Load(), cb.zeroes.Load(), out)
	}
	got := make([]byte, 64<<10)
	if _, err := cb.ReadAt(got, 64<<10); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{0xab}, 64<<10)) {
		t.Fatalf("backend content wrong after qemu-io: %v", err)
	}
}

// TestNbdcopy copies an image in and out over several connections and compares bytes.
func TestNbdcopy(t *testing.T) {
	needBinary(t, "nbdcopy")
	const size = 24 << 20
	cb, e := fileExport(t, size)
	_, sock := startServer(t, Options{}, e)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.img")
	img := make([]byte, size)
	rand.Read(img[:size/2]) // the second half stays zero: nbdcopy zeroes or trims it
	if err := os.WriteFile(in, img, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "nbdcopy", "--connections=4", "--requests=32", "--flush", in, uri(sock))
	got := make([]byte, size)
	if _, err := cb.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, img) {
		t.Fatal("backend differs from the image copied in")
	}
	if cb.flushes.Load() == 0 {
		t.Fatal("nbdcopy --flush did not reach the backend")
	}
	out := filepath.Join(dir, "out.img")
	run(t, "nbdcopy", "--connections=4", "--requests=32", uri(sock), out)
	back, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, img) {
		t.Fatal("image copied out differs")
	}
}

// TestFioVerify runs fio's nbd engine at QD32 over 4 connections with crc32c verification.
func TestFioVerify(t *testing.T) {
	needBinary(t, "fio")
	_, e := fileExport(t, 64<<20)
	_, sock := startServer(t, Options{}, e)
	size := "16M"
	if testing.Short() {
		size = "4M"
	}
	out := run(t, "fio", "--name=verify", "--ioengine=nbd", "--uri="+uri(sock),
		"--rw=randwrite", "--bs=4k", "--iodepth=32", "--numjobs=4", "--size="+size,
		"--offset_increment=16M", "--verify=crc32c", "--verify_state_save=0", "--verify_fatal=1",
		"--group_reporting", "--output-format=terse", "--terse-version=3")
	// terse v3: field 5 is the error count of the job group.
	fields := strings.Split(strings.TrimSpace(lastLine(out)), ";")
	if len(fields) < 5 || fields[4] != "0" {
		t.Fatalf("fio reported errors:\n%s", out)
	}
	out = run(t, "fio", "--name=mixed", "--ioengine=nbd", "--uri="+uri(sock),
		"--rw=randrw", "--bs=4k-64k", "--iodepth=32", "--numjobs=2", "--size="+size,
		"--offset_increment=16M", "--verify=crc32c", "--verify_state_save=0", "--verify_fatal=1", "--do_verify=1",
		"--fsync=64", "--trim_percentage=0", "--group_reporting")
	if strings.Contains(out, "verify: bad") || strings.Contains(out, "err=") && !strings.Contains(out, "err= 0") {
		t.Fatalf("fio randrw:\n%s", out)
	}
}

// TestFioVerifyStalls runs fio's nbd engine with crc32c verification against a backend of
// which one request in 20 stalls for 5 ms, at queue depth 1 so that the reader executes each
// request itself: the watchdog takes stalled readers over again and again while fio goes on.
func TestFioVerifyStalls(t *testing.T) {
	needBinary(t, "fio")
	mem := newMemBackend(32 << 20)
	mem.stallEvery = 20
	srv, sock := startServer(t, Options{}, Export{Backend: mem})
	out := run(t, "fio", "--name=stalls", "--ioengine=nbd", "--uri="+uri(sock),
		"--rw=randwrite", "--bs=4k", "--iodepth=1", "--numjobs=2", "--offset=2M", "--size=2M", // 1 MiB: the ENOSPC hook
		"--offset_increment=16M", "--verify=crc32c", "--verify_state_save=0", "--verify_fatal=1",
		"--group_reporting", "--output-format=terse", "--terse-version=3")
	fields := strings.Split(strings.TrimSpace(lastLine(out)), ";")
	if len(fields) < 5 || fields[4] != "0" {
		t.Fatalf("fio reported errors:\n%s", out)
	}
	if srv.takeovers.Load() == 0 {
		t.Fatal("no reader was taken over: the test did not exercise the watchdog")
	}
	t.Logf("%d reader roles taken over", srv.takeovers.Load())
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
