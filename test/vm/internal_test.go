package vm

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

func TestVersionLess(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
		want bool
	}{
		{"numeric not lexical", "6.1.0-9-amd64", "6.1.0-57-amd64", true},
		{"minor", "6.1.0-57-amd64", "6.12.0-1-amd64", true},
		{"equal", "6.1.0-57-amd64", "6.1.0-57-amd64", false},
		{"greater", "6.12.0-1-amd64", "6.1.0-57-amd64", false},
		{"prefix", "6.1", "6.1.1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionLess(tc.a, tc.b); got != tc.want {
				t.Errorf("versionLess(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}

// TestCpioWriter checks the newc archive with the real cpio tool when present.
func TestCpioWriter(t *testing.T) {
	testenv.Tool(t, "cpio", "Debian package cpio")
	var buf bytes.Buffer
	w := &cpioWriter{w: &buf}
	w.dir("bin")
	w.file("bin/hello", 0o755, []byte("hello, world\n"))
	w.file("odd", 0o644, []byte("abc"))
	w.chardev("console", 0o600, 5, 1)
	w.trailer()
	if w.err != nil {
		t.Fatal(w.err)
	}
	dir := t.TempDir()
	cmd := exec.Command("cpio", "-idv", "--quiet")
	cmd.Dir = dir
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -id: %v: %s", err, out)
	}
	names := strings.Fields(string(out))
	sort.Strings(names)
	if got, want := strings.Join(names, " "), "bin bin/hello console odd"; got != want {
		t.Errorf("entries %q, want %q", got, want)
	}
	b, err := os.ReadFile(filepath.Join(dir, "bin/hello"))
	if err != nil || string(b) != "hello, world\n" {
		t.Errorf("bin/hello = %q, %v", b, err)
	}
	st, err := os.Stat(filepath.Join(dir, "bin/hello"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("bin/hello mode %v, %v", st.Mode(), err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "odd")); string(b) != "abc" {
		t.Errorf("odd = %q", b)
	}
}

// TestShQuote round-trips awkward strings through the real sh.
func TestShQuote(t *testing.T) {
	args := []string{"plain", "it's", `$HOME "x" \n`, "", "a b\tc"}
	out, err := exec.Command("sh", "-c", `for a in `+ShellJoin(args...)+`; do printf '[%s]' "$a"; done`).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for _, a := range args {
		want += "[" + a + "]"
	}
	if string(out) != want {
		t.Errorf("got %q, want %q", out, want)
	}
}

func TestWritableShares(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"dir visible", Options{Dir: "/work/x"}, ""},
		{"dir under tmp shared", Options{Dir: "/tmp/a/b"}, "/tmp/a/b"},
		{"dir covered by writable", Options{Dir: "/tmp/a/b", Writable: []string{"/tmp/a"}}, "/tmp/a"},
		{"parents first", Options{Dir: "/work", Writable: []string{"/tmp/a/b/c", "/tmp/a"}}, "/tmp/a /tmp/a/b/c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := strings.Join(tc.opts.writableShares(), " "); got != tc.want {
				t.Errorf("writableShares() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		ok   bool
	}{
		{"defaults", Options{}, true},
		{"comma in path", Options{Writable: []string{"/tmp/a,b"}}, false},
		{"space in dir", Options{Dir: "/tmp/a b"}, false},
		{"missing dir", Options{Dir: "/nonexistent/raid10-vm"}, false},
		{"bad env", Options{Env: []string{"NOEQUALS"}}, false},
		{"bad env name", Options{Env: []string{"A-B=1"}}, false},
		{"env value anything", Options{Env: []string{"A=it's ; $x"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.opts.withDefaults()
			if (err == nil) != tc.ok {
				t.Errorf("withDefaults() err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestReadModuleDecompresses: compressed modules come out as plain .ko files.
func TestReadModuleDecompresses(t *testing.T) {
	want := bytes.Repeat([]byte("\x7fELF fake module "), 1000)
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		tool []string // compressor, reads stdin, writes stdout
		ext  string
	}{
		{"plain", nil, ""},
		{"gzip", []string{"gzip", "-c"}, ".gz"},
		{"xz", []string{"xz", "-c", "--check=crc32"}, ".xz"},
		{"zstd", []string{"zstd", "-q", "-c"}, ".zst"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := want
			if tc.tool != nil {
				testenv.RequireTools(t, tc.tool[0])
				cmd := exec.Command(tc.tool[0], tc.tool[1:]...)
				cmd.Stdin = bytes.NewReader(want)
				var err error
				if data, err = cmd.Output(); err != nil {
					t.Fatal(err)
				}
			}
			p := filepath.Join(dir, "fake.ko"+tc.ext)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, name, err := readModule(t.Context(), p)
			if err != nil {
				t.Fatal(err)
			}
			if name != "fake.ko" || !bytes.Equal(got, want) {
				t.Errorf("readModule(%s) = %d bytes named %q, want %d bytes named fake.ko", p, len(got), name, len(want))
			}
		})
	}
}

// TestHasPVHNote: the real kernel's vmlinux has the PVH note (when the vm cache
// has extracted it), random bytes do not.
func TestHasPVHNote(t *testing.T) {
	if hasPVHNote([]byte("not an elf file")) {
		t.Error("hasPVHNote(garbage) = true")
	}
	k, err := FindKernel()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	p, err := extractVmlinux(t.Context(), k)
	if err != nil {
		testenv.Missing(t, "kernel %s: no vmlinux extracted (the VM boots it as a bzImage): %v", k.Version, err)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !hasPVHNote(raw) {
		t.Errorf("%s: extracted vmlinux lacks the PVH note", p)
	}
}

func TestConsoleTailKeepsPanicLine(t *testing.T) {
	var b strings.Builder
	b.WriteString("boot\nKernel panic - not syncing: sysrq triggered crash\n")
	for i := 0; i < 100; i++ {
		b.WriteString(" trace line\n")
	}
	b.WriteString("Kernel Offset: disabled\n")
	r := &Result{ConsoleLog: b.String()}
	got := r.ConsoleTail(5)
	if !strings.HasPrefix(got, "Kernel panic - not syncing") || !strings.HasSuffix(got, "Kernel Offset: disabled") ||
		strings.Count(got, "\n") != 6 {
		t.Errorf("ConsoleTail(5) = %q", got)
	}
	if got := (&Result{ConsoleLog: "a\nb\n"}).ConsoleTail(5); got != "a\nb" {
		t.Errorf("short log: %q", got)
	}
}

// TestCheckGuestTests: the wrapper's verdict on canned guest outputs. Each case that
// must fail is one way an in-guest test can pass vacuously: a zero exit status alone
// would have let it through.
func TestCheckGuestTests(t *testing.T) {
	const passA = "=== RUN   TestA\n    a_test.go:9: did it\n--- PASS: TestA (1.20s)\n"
	for _, tc := range []struct {
		name   string
		tests  []string
		output string
		want   []string // substrings of the error; none: no error
	}{
		{"pass", []string{"TestA"}, passA + "PASS\n", nil},
		{"pass with subtests and another test", []string{"TestA", "TestB"},
			passA + "=== RUN   TestB\n=== RUN   TestB/x\n    --- PASS: TestB/x (0.00s)\n--- PASS: TestB (0.01s)\n" +
				"=== RUN   TestC\n--- PASS: TestC (0.00s)\nPASS\n", nil},
		{"another test matched by -test.run skipped", []string{"TestA"},
			passA + "=== RUN   TestBench\n    b_test.go:3: [driven] run by BenchmarkX\n--- SKIP: TestBench (0.00s)\nPASS\n",
			[]string{"skipped in the guest, where they must run: TestBench"}},
		{"interleaved with a child's output", []string{"TestA"}, "child log line without newline--- PASS: TestA (0.50s)\nPASS\n", nil},
		{"renamed: no tests to run", []string{"TestA"}, "testing: warning: no tests to run\nPASS\n",
			[]string{"no tests to run", "TestA did not run"}},
		{"skipped in the guest", []string{"TestA"},
			"=== RUN   TestA\n    a_test.go:9: [missing] mkfs.xfs not found\n--- SKIP: TestA (0.00s)\nPASS\n",
			[]string{"TestA: --- SKIP, want --- PASS", "skipped in the guest, where they must run: TestA"}},
		{"subtest skipped in the guest", []string{"TestA"},
			"=== RUN   TestA\n=== RUN   TestA/xfs\n    --- SKIP: TestA/xfs (0.00s)\n--- PASS: TestA (0.02s)\nPASS\n",
			[]string{"skipped in the guest, where they must run: TestA/xfs"}},
		{"one of two missing", []string{"TestA", "TestB"}, passA + "PASS\n", []string{"TestB did not run"}},
		{"a longer name is not the test", []string{"TestA"}, "--- PASS: TestAB (0.01s)\nPASS\n", []string{"TestA did not run"}},
		{"a subtest's pass is not the test's", []string{"TestA"}, "    --- PASS: TestA/x (0.01s)\n--- FAIL: TestA (0.01s)\n",
			[]string{"TestA: --- FAIL, want --- PASS"}},
		{"nothing named", nil, passA, []string{"no in-guest tests named"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkGuestTests(tc.output, tc.tests)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("checkGuestTests = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("checkGuestTests = nil, want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestGuestTestArgs: the expected tests come from Options.Tests or a plain -test.run
// list; anything else must be named; -test.v is always there.
func TestGuestTestArgs(t *testing.T) {
	for _, tc := range []struct {
		name             string
		tests, args      []string
		wantArgs, wantTs []string
		wantErr          bool
	}{
		{"one", nil, []string{"-test.run=^TestA$", "-test.v"}, []string{"-test.run=^TestA$", "-test.v"}, []string{"TestA"}, false},
		{"group", nil, []string{"-test.run=^(TestA|TestB)$"}, []string{"-test.run=^(TestA|TestB)$", "-test.v"}, []string{"TestA", "TestB"}, false},
		{"alternatives", nil, []string{"-test.run", "^TestA$|^TestB$", "-test.v=true"}, []string{"-test.run", "^TestA$|^TestB$", "-test.v=true"}, []string{"TestA", "TestB"}, false},
		{"prefix needs names", nil, []string{"-test.run=^TestIn"}, nil, nil, true},
		{"unanchored needs names", nil, []string{"-test.run=TestA"}, nil, nil, true},
		{"half a group", nil, []string{"-test.run=^(TestA|TestB$"}, nil, nil, true},
		{"no run and no names", nil, []string{"-test.v"}, nil, nil, true},
		{"prefix with names", []string{"TestInA", "TestInB"}, []string{"-test.run=^TestIn", "-test.timeout=5m"},
			[]string{"-test.run=^TestIn", "-test.timeout=5m", "-test.v"}, []string{"TestInA", "TestInB"}, false},
		{"names build the run", []string{"TestA", "TestB"}, nil, []string{"-test.run=^(TestA|TestB)$", "-test.v"}, []string{"TestA", "TestB"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, tests, err := guestTestArgs(tc.tests, tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("guestTestArgs(%q, %q) error = %v, want error %v", tc.tests, tc.args, err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if !slices.Equal(args, tc.wantArgs) || !slices.Equal(tests, tc.wantTs) {
				t.Fatalf("guestTestArgs(%q, %q) = %q, %q; want %q, %q", tc.tests, tc.args, args, tests, tc.wantArgs, tc.wantTs)
			}
		})
	}
}

func TestInSeries(t *testing.T) {
	for _, tc := range []struct {
		ver, series string
		want        bool
	}{
		{"6.1.0-57-amd64", "6.1", true},
		{"6.1.0-57-amd64", "6.12", false},
		{"6.12.117+deb12-amd64", "6.12", true},
		{"6.12.117+deb12-amd64", "6.1", false},
		{"6.12", "6.12", true},
		{"6.120.1", "6.12", false},
	} {
		if got := inSeries(tc.ver, tc.series); got != tc.want {
			t.Errorf("inSeries(%q, %q) = %v, want %v", tc.ver, tc.series, got, tc.want)
		}
	}
}

// TestDeviceArgs: NVMe and virtio disks with serials, the restricted user network with its
// guestfwd commands in a stable order, and the inputs QEMU's option syntax cannot carry.
func TestDeviceArgs(t *testing.T) {
	o := Options{
		Disks: []Disk{{File: "/d/state.img", Serial: "st"}, {File: "/d/n0.img", NVMe: true, Serial: "SN0"}},
		Net: &Net{Network: "10.0.0.0/16", GuestFwd: map[string]string{
			"10.0.1.1:443": "socat - TCP:127.0.0.1:6443", "10.0.1.2:80": "cat"}},
	}
	got, err := o.deviceArgs()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-drive", "file=/d/state.img,if=none,id=disk0,format=raw,cache=unsafe,aio=threads", "-device", "virtio-blk-pci,drive=disk0,serial=st",
		"-drive", "file=/d/n0.img,if=none,id=disk1,format=raw,cache=unsafe,aio=threads", "-device", "nvme,drive=disk1,serial=SN0",
		"-netdev", "user,id=net0,restrict=on,net=10.0.0.0/16,guestfwd=tcp:10.0.1.1:443-cmd:socat - TCP:127.0.0.1:6443,guestfwd=tcp:10.0.1.2:80-cmd:cat",
		"-device", "virtio-net-pci,netdev=net0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("deviceArgs:\n got %q\nwant %q", got, want)
	}
	for _, bad := range []Options{
		{Disks: []Disk{{File: "/d/a,b.img"}}},
		{Disks: []Disk{{File: "/d/a.img", Serial: "a b"}}},
		{Disks: []Disk{{}}},
		{Net: &Net{GuestFwd: map[string]string{"10.0.2.100:1": "sh -c a,b"}}},
	} {
		if _, err := bad.deviceArgs(); err == nil {
			t.Errorf("deviceArgs(%+v): no error", bad)
		}
	}
}

// TestNoExitSync: Options.NoExitSync reaches the guest's config.sh, and init's halt skips
// its sync only then (run by busybox sh here, with sync and poweroff stubbed).
func TestNoExitSync(t *testing.T) {
	start := bytes.Index(initScript, []byte("halt() {"))
	if start < 0 {
		t.Fatal("init.sh has no halt()")
	}
	halt := string(initScript[start:])
	halt = halt[:strings.IndexByte(halt, '\n')]
	for _, no := range []bool{false, true} {
		dir := t.TempDir()
		if err := writeRunFiles(dir, Options{NoExitSync: no, Dir: dir}, Kernel{}, "true"); err != nil {
			t.Fatal(err)
		}
		config, err := os.ReadFile(filepath.Join(dir, "config.sh"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(config), "NO_EXIT_SYNC=1\n"); got != no {
			t.Fatalf("NoExitSync %v: config.sh sets NO_EXIT_SYNC: %v\n%s", no, got, config)
		}
		// Only the variable: config.sh's vm_setup calls functions init defines.
		script := "sync() { echo synced; }\npoweroff() { echo off \"$*\"; }\nsleep() { :; }\n" + halt + "\n"
		if no {
			script = "NO_EXIT_SYNC=1\n" + script
		}
		out, err := exec.Command("sh", "-c", script+"halt").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "off") {
			t.Fatalf("NoExitSync %v: halt: %v\n%s", no, err, out)
		}
		// busybox's poweroff syncs by itself unless given -n.
		synced := strings.Contains(string(out), "synced") || !strings.Contains(string(out), "-n")
		if synced == no {
			t.Fatalf("NoExitSync %v: halt synced: %v\n%s", no, synced, out)
		}
	}
}

// TestBuildGoTestOnce: a second RunGoTestOpts of the same package and flags in one process
// reuses the binary of the first (no second link); the kept binary's directory names the
// process, and a dead process's one is removed.
func TestBuildGoTestOnce(t *testing.T) {
	testenv.Heavy(t, "links a test binary")
	ctx := t.Context()
	bin1, dir1, cleanup1, err := buildGoTestOnce(ctx, "../../internal/atomicfile")
	if err != nil {
		t.Fatal(err)
	}
	cleanup1()
	st1, err := os.Stat(bin1)
	if err != nil {
		t.Fatalf("the kept binary is gone after its cleanup: %v", err)
	}
	bin2, dir2, _, err := buildGoTestOnce(ctx, "../../internal/atomicfile")
	if err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(bin2)
	if err != nil || bin2 != bin1 || dir2 != dir1 || !st2.ModTime().Equal(st1.ModTime()) {
		t.Fatalf("second build: %s %s (%v), want the first's %s %s", bin2, dir2, err, bin1, dir1)
	}
	if pid, ok := keptPid(filepath.Base(filepath.Dir(bin1))); !ok || pid != os.Getpid() {
		t.Fatalf("kept in %s: want this process's pid %d", filepath.Dir(bin1), os.Getpid())
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(bin1)) })
	// A process that has ended: its kept directory goes at the next build.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(filepath.Dir(bin1))
	stale := filepath.Join(base, pidPrefix+strconv.Itoa(dead.Process.Pid)+"-test")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	removeDeadPids(base)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("%s of an ended process is still there (%v)", stale, err)
	}
	if _, err := os.Stat(bin1); err != nil {
		t.Fatalf("this process's kept binary was removed: %v", err)
	}
}
