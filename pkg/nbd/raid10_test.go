package nbd

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/raid10-csi/raid10-csi/pkg/blockdev"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// The RAID10 engine is the Backend this server exists for.
var (
	_ blockdev.Backend    = (*raid10.Array)(nil)
	_ blockdev.FUAWriter  = (*raid10.Array)(nil)
	_ blockdev.Discarder  = (*raid10.Array)(nil)
	_ blockdev.ZeroWriter = (*raid10.Array)(nil)
)

// TestRAID10Backend serves a RAID10 array over 4 file members and drives it with real
// clients: nbdcopy in and out byte-exact over 4 connections, then fio with verification.
func TestRAID10Backend(t *testing.T) {
	needBinary(t, "nbdcopy")
	needBinary(t, "fio")
	dir := t.TempDir()
	var members []raid10.Member
	for i := 0; i < 4; i++ {
		p := filepath.Join(dir, fmt.Sprintf("m%d", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 40<<20); err != nil {
			t.Fatal(err)
		}
		m, err := raid10.OpenFileMember(p)
		if err != nil {
			t.Fatal(err)
		}
		members = append(members, m)
	}
	arr, err := raid10.Create(members, raid10.CreateOptions{AssumeClean: true})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	srv, sock := startServer(t, Options{MinBlockSize: raid10.BlockSize}, Export{Backend: arr})

	size := arr.Size() &^ (1<<20 - 1)
	img := make([]byte, size)
	rand.Read(img)
	in := filepath.Join(dir, "in.img")
	if err := os.WriteFile(in, img, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, "nbdcopy", "--connections=4", "--flush", in, uri(sock))
	out := filepath.Join(dir, "out.img")
	run(t, "nbdcopy", "--connections=4", uri(sock), out)
	back, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back[:size], img) {
		t.Fatal("image read back through RAID10 differs")
	}
	o := run(t, "fio", "--name=r10", "--ioengine=nbd", "--uri="+uri(sock), "--rw=randwrite",
		"--bs=4k", "--iodepth=32", "--numjobs=4", "--size=4M", "--offset_increment=8M",
		"--verify=crc32c", "--verify_state_save=0", "--verify_fatal=1", "--group_reporting")
	if !bytes.Contains([]byte(o), []byte("err= 0")) {
		t.Fatalf("fio:\n%s", o)
	}
	// The engine is an AsyncBackend: its reads and plain writes went through the queues.
	st, err := srv.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reads %d (%d queued), writes %d (%d queued)", st.Read.Requests, st.Read.Queued, st.Write.Requests, st.Write.Queued)
	if st.Read.Queued == 0 || st.Write.Queued == 0 {
		t.Fatalf("no request went through the asynchronous queue: %+v", st)
	}
}
