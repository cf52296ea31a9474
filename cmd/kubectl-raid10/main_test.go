package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"512Mi", 512 << 20, true},
		{"10Gi", 10 << 30, true},
		{"1G", 1e9, true},
		{"4096", 4096, true},
		{"0", 0, false},
		{"-1Gi", 0, false},
		{"1.5Gi", 0, false},
		{"Gi", 0, false},
		{"99999999999Ti", 0, false},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := parseSize(c.in)
			if (err == nil) != c.ok || got != c.want {
				t.Fatalf("parseSize(%q) = %d, %v", c.in, got, err)
			}
			if err != nil && !errors.Is(err, pool.ErrInvalidArgument) {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
		})
	}
}

// setup makes n sparse disks and a pool configuration.
func setup(t *testing.T, n int) (dir string, o *Options) {
	t.Helper()
	dir = t.TempDir()
	var cfg pool.Config
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 128<<20); err != nil {
			t.Fatal(err)
		}
	}
	// A glob, so that disks added later (named disk*.img) are found again after a restart.
	cfg.Disks = []pool.DiskConfig{{Path: filepath.Join(dir, "disk*.img")}}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "pool.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, &Options{Local: true, PoolConfig: cfgPath, RunDir: filepath.Join(dir, "run"), Output: "table"}
}

func runOK(t *testing.T, o *Options, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	oo := *o
	if err := run(context.Background(), &oo, args, &out); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String()
}

// TestDirectMode runs the commands with no agent: each opens the pool from its
// configuration and closes it again.
func TestDirectMode(t *testing.T) {
	dir, o := setup(t, 4)
	out := runOK(t, o, "create", "v1", "32Mi")
	if !strings.Contains(out, "v1") || !strings.Contains(out, "Healthy") || !strings.Contains(out, "4/4") {
		t.Fatalf("create:\n%s", out)
	}
	var vs []pool.VolumeInfo
	if err := json.Unmarshal([]byte(runOK(t, o, "volumes", "-o", "json")), &vs); err != nil || len(vs) != 1 || vs[0].Size != 32<<20 {
		t.Fatalf("volumes -o json: %+v %v", vs, err)
	}
	var vy []pool.VolumeInfo
	if err := yaml.Unmarshal([]byte(runOK(t, o, "volumes", "-o", "yaml")), &vy); err != nil || len(vy) != 1 || vy[0].Size != 32<<20 || vy[0].Name != "v1" {
		t.Fatalf("volumes -o yaml: %+v %v", vy, err)
	}
	runOK(t, o, "disk", "fail", filepath.Join(dir, "disk2.img"))
	out = runOK(t, o, "status")
	for _, want := range []string{"Degraded", "3/4", "Failed", "largest new volume"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
	spare := filepath.Join(dir, "disk9.img")
	_ = os.WriteFile(spare, nil, 0o600)
	_ = os.Truncate(spare, 128<<20)
	runOK(t, o, "disk", "replace", filepath.Join(dir, "disk2.img"), spare)
	out = runOK(t, o, "wait", "v1", "--timeout", "1m")
	if !strings.Contains(out, "v1: Healthy, 4/4") {
		t.Fatalf("wait:\n%s", out)
	}
	// Errors keep their sentinel through the command path.
	var buf bytes.Buffer
	if err := run(context.Background(), o, []string{"create", "v1", "64Mi"}, &buf); !errors.Is(err, pool.ErrAlreadyExists) {
		t.Fatalf("create with another size: %v", err)
	}
	if err := run(context.Background(), o, []string{"create", "x"}, &buf); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Fatalf("missing argument: %v", err)
	}
	runOK(t, o, "delete", "v1")
	runOK(t, o, "delete", "v1")
}

// startAgent runs `serve` in this process until the test ends.
func startAgent(t *testing.T, o *Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if h, err := admin.Dial(ctx, admin.Socket(o.RunDir)); err == nil {
			h.Close()
			return
		}
		select {
		case err := <-done:
			t.Fatalf("agent exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("agent did not come up")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func nbdURI(o *Options, vol string) string {
	return "nbd+unix:///?socket=" + nbdSocket(o.RunDir, vol)
}

// TestAgentWithNBDClients: the agent serves a volume; nbdcopy writes and reads it; a disk
// fails and is replaced through the admin socket while the data stays readable.
func TestAgentWithNBDClients(t *testing.T) {
	testenv.RequireTools(t, "nbdcopy", "nbdinfo") // libnbd-bin
	dir, o := setup(t, 4)
	startAgent(t, o)
	agentOnly := *o
	agentOnly.PoolConfig = "" // every command must go through the agent
	runOK(t, &agentOnly, "create", "web", "48Mi")
	data := make([]byte, 48<<20)
	_, _ = rand.Read(data)
	src := filepath.Join(dir, "data.bin")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	uri := nbdURI(o, "web")
	if out, err := exec.Command("nbdcopy", "--flush", src, uri).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy in: %v\n%s", err, out)
	}
	verify := func(when string) {
		out, err := exec.Command("nbdcopy", uri, "-").Output()
		if err != nil {
			t.Fatalf("nbdcopy out (%s): %v", when, err)
		}
		if sha256.Sum256(out) != sha256.Sum256(data) {
			t.Fatalf("data differs %s", when)
		}
	}
	verify("after write")
	var buf bytes.Buffer
	if err := run(context.Background(), &agentOnly, []string{"create", "web", "96Mi"}, &buf); !errors.Is(err, pool.ErrAlreadyExists) {
		t.Fatalf("create with another size through the agent: %v", err)
	}
	runOK(t, &agentOnly, "disk", "fail", filepath.Join(dir, "disk0.img"))
	if out := runOK(t, &agentOnly, "volumes", "web"); !strings.Contains(out, "Degraded") {
		t.Fatalf("after fail:\n%s", out)
	}
	verify("degraded")
	repl := filepath.Join(dir, "repl.img") // not in the configured list: used, with a warning
	_ = os.WriteFile(repl, nil, 0o600)
	_ = os.Truncate(repl, 128<<20)
	if out := runOK(t, &agentOnly, "disk", "replace", filepath.Join(dir, "disk0.img"), repl); !strings.Contains(out, "not in the configured disk list") {
		t.Fatalf("replace onto an unlisted disk gives no warning:\n%s", out)
	}
	runOK(t, &agentOnly, "wait", "web", "--timeout", "2m")
	verify("after rebuild")
	runOK(t, &agentOnly, "delete", "web")
	if _, err := os.Stat(nbdSocket(o.RunDir, "web")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket of a deleted volume: %v", err)
	}
}

// TestDemo runs `make demo`'s script end to end (about a minute).
func TestDemo(t *testing.T) {
	testenv.Heavy(t, "the demo takes about a minute")
	testenv.RequireTools(t, "nbdcopy", "nbdinfo", "qemu-io", "bash")
	cmd := exec.Command("bash", "../../hack/demo.sh")
	cmd.Env = append(os.Environ(), "DEMO_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out)
	}
	for _, want := range []string{"Degraded", "Rebuilding", "Healthy, 4/4 members in sync", "data verified (rebuild)", "data verified (restart)"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// TestUsage: help lists every command of both dispatch tables; a synopsis that fits its
// column has its text beside it, a longer one on the lines below, under the others.
func TestUsage(t *testing.T) {
	u := usage()
	for _, want := range []string{
		"\n  create NAME SIZE [--members N] create a volume (SIZE like 10Gi, 512Mi, 1G, bytes)\n",
		"\n  disk add PATH [--spare] [--wipe]\n                                 add a disk (or bring back a missing one)\n",
		"\n  status                         nodes (disks healthy/total, usable, free) and volumes,\n" +
			"                                 failed, degraded and rebuilding ones first\n",
	} {
		if !strings.Contains(u, want) {
			t.Errorf("help lacks %q:\n%s", want, u)
		}
	}
	for _, cmds := range [][]command{clusterCommands, localCommands} {
		for _, c := range cmds {
			for _, s := range append([]command{c}, c.sub...) {
				if s.sub == nil && !strings.Contains(u, "\n  "+s.synopsis) {
					t.Errorf("help lacks %q", s.synopsis)
				}
			}
		}
	}
}
