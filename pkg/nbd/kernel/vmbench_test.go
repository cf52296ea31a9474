package kernel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/vm"
)

const benchEnv = "NBD_VM_BENCH_OUT"

// BenchmarkKernelVM compares, in one VM run, fio libaio 4k randread and randwrite at QD32 on
// /dev/md0 (md raid10 over 4 brd ramdisks), on /dev/nbdX served by this server with the RAID10
// engine over the same 4 ramdisks, and on /dev/nbdY served by nbdkit's memory plugin (the
// limit of the userspace NBD path). It logs IOPS and ratios, and the top of a CPU profile of
// the server taken in the guest.
func BenchmarkKernelVM(b *testing.B) {
	vm.HostHalf(b)
	out := b.TempDir()
	vm.RunGoTestOpts(b, vm.Options{
		Timeout:      6 * time.Minute,
		Memory:       2048,
		Env:          []string{benchEnv + "=" + out},
		Writable:     []string{out},
		ModuleParams: map[string]string{"brd": "rd_nr=4 rd_size=131072"},
	}, ".", "-test.run=^TestInKernelBench$", "-test.v", "-test.timeout=5m")
	if res, err := os.ReadFile(filepath.Join(out, "result.txt")); err == nil {
		b.Log("\n" + string(res))
	}
	if top, err := vm.PprofTop(filepath.Join(out, "server.cpu")); err == nil {
		b.Log("CPU profile of the server in the guest during the raid10-csi runs:\n" + top)
	}
}

// guestFio runs 8 s of 4 KiB rw (randread, randwrite) at QD32 on dev and returns the IOPS.
func guestFio(t *testing.T, dev, rw string) float64 {
	t.Helper()
	r := vm.RunFio(t, vm.FioJob{Name: "b", File: dev, RW: rw, IODepth: 32, Size: "200M",
		Extra: []string{"--time_based", "--runtime=8", "--ramp_time=1"}})
	t.Logf("%s %s: %.0f IOPS", dev, rw, r.IOPS())
	return r.IOPS()
}

// TestInKernelBench is the guest half of BenchmarkKernelVM.
func TestInKernelBench(t *testing.T) {
	inGuest(t)
	outDir := os.Getenv(benchEnv)
	if outDir == "" {
		testenv.Skip(t, testenv.KindDriven, "run by BenchmarkKernelVM")
	}
	rams := []string{"/dev/ram0", "/dev/ram1", "/dev/ram2", "/dev/ram3"}
	iops := map[string]float64{}

	// md raid10 over the ramdisks.
	stopMD := vm.CreateMD(t, "/dev/md0", rams)
	for _, rw := range []string{"randread", "randwrite"} {
		iops["md/"+rw] = guestFio(t, "/dev/md0", rw)
	}
	stopMD()

	// This server with the RAID10 engine over the same ramdisks.
	arr := vm.CreateArray(t, rams, raid10.CreateOptions{AssumeClean: true})
	srv, err := nbd.NewServer(nbd.Options{MinBlockSize: raid10.BlockSize}, nbd.Export{Name: "r10", Backend: arr})
	if err != nil {
		t.Fatal(err)
	}
	nl, err := Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	st, err := OpenState(filepath.Join(t.TempDir(), "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	a := NewAttacher(srv, nl, st, Options{Connections: 2})
	d, err := a.Attach("bench", "r10")
	if err != nil {
		t.Fatal(err)
	}
	stopProfile := vm.CPUProfile(t, filepath.Join(outDir, "server.cpu"))
	for _, rw := range []string{"randread", "randwrite"} {
		iops["raid10-csi/"+rw] = guestFio(t, d.Path(), rw)
	}
	stopProfile()
	if err := a.Detach("bench"); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	arr.Close()

	// nbdkit's memory plugin attached by nbd-client with as many connections.
	sock := filepath.Join(t.TempDir(), "nbdkit.sock")
	kit := exec.Command("nbdkit", "--foreground", "--unix", sock, "memory", "512M")
	if err := kit.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { kit.Process.Kill(); kit.Wait() }()
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	kdev := fmt.Sprintf("/dev/nbd%d", d.Index+1)
	vm.Sh(t, "nbd-client", "-N", "", "-u", sock, kdev, "-b", "4096", "-C", "2")
	for _, rw := range []string{"randread", "randwrite"} {
		iops["nbdkit/"+rw] = guestFio(t, kdev, rw)
	}
	vm.Sh(t, "nbd-client", "-d", kdev)

	var r strings.Builder
	fmt.Fprintf(&r, "fio libaio 4k QD32 in the VM (TCG), 2 NBD connections\n")
	fmt.Fprintf(&r, "%-10s %12s %12s %12s %12s %10s\n", "", "md raid10", "raid10-csi", "nbdkit mem", "/nbdkit", "/md")
	for _, rw := range []string{"randread", "randwrite"} {
		o, k, m := iops["raid10-csi/"+rw], iops["nbdkit/"+rw], iops["md/"+rw]
		fmt.Fprintf(&r, "%-10s %12.0f %12.0f %12.0f %11.2fx %9.2fx\n", rw, m, o, k, o/k, o/m)
	}
	t.Log("\n" + r.String())
	if err := os.WriteFile(filepath.Join(outDir, "result.txt"), []byte(r.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
