package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	nodeagent "github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
	"github.com/raid10-csi/raid10-csi/test/kubeenv"
)

const (
	clusterNode  = "node-a"
	clusterDisk  = 256 << 20
	clusterVol   = 64 << 20
	rebuildSlow  = 4 << 20 // 32 MiB per member at 4 MiB/s: about 8 s of visible rebuild
	pollInterval = 50 * time.Millisecond
)

// barRE matches a rebuild progress bar.
var barRE = regexp.MustCompile(`\[[#.]{10}\] \d{1,3}% ETA (-|[0-9hms]+)`)

// cluster is a real API server with the chart's CRDs, node-a's agent over a pool of file
// disks, and a kubeconfig for the plugin.
type cluster struct {
	t     *testing.T
	c     client.Client
	o     *Options
	pool  *pool.Pool
	disks []string // disk0.img .. disk5.img; the pool starts with the first four
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	env := kubeenv.Start(t)
	if names := env.InstallCRDs(t, "../../charts/raid10-csi/crds"); len(names) != 3 {
		t.Fatalf("CRDs: %v", names)
	}
	s, err := nodeagent.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cl := &cluster{t: t, c: c, o: &Options{Output: "table", RunDir: filepath.Join(dir, "run"), Kubeconfig: env.Kubeconfig}}
	var pcfg pool.Config
	for i := range 6 {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, clusterDisk); err != nil {
			t.Fatal(err)
		}
		cl.disks = append(cl.disks, p)
		if i < 4 {
			pcfg.Disks = append(pcfg.Disks, pool.DiskConfig{Path: p})
		}
	}
	pcfg.RebuildRateMax = rebuildSlow
	if cl.pool, err = pool.Open(pcfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- nodeagent.Run(ctx, env.Config, nodeagent.Options{NodeName: clusterNode, Pool: cl.pool})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
		_ = cl.pool.Close()
	})
	cl.waitFor(time.Minute, "Raid10Node reported", func() bool {
		var n v1alpha1.Raid10Node
		return c.Get(t.Context(), client.ObjectKey{Name: clusterNode}, &n) == nil && n.Status.DiskCount == 4
	})
	return cl
}

func (cl *cluster) waitFor(timeout time.Duration, what string, cond func() bool) time.Duration {
	cl.t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			cl.t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(pollInterval)
	}
	return time.Since(start)
}

// kubectl runs the plugin in cluster mode and returns its output.
func (cl *cluster) kubectl(args ...string) (string, error) {
	var out bytes.Buffer
	o := *cl.o
	err := run(cl.t.Context(), &o, args, &out)
	return out.String(), err
}

func (cl *cluster) kubectlOK(args ...string) string {
	cl.t.Helper()
	out, err := cl.kubectl(args...)
	if err != nil {
		cl.t.Fatalf("kubectl raid10 %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (cl *cluster) volume(name string) *v1alpha1.Raid10Volume {
	cl.t.Helper()
	var v v1alpha1.Raid10Volume
	if err := cl.c.Get(cl.t.Context(), client.ObjectKey{Name: name}, &v); err != nil {
		cl.t.Fatal(err)
	}
	return &v
}

func (cl *cluster) node(name string) *v1alpha1.Raid10Node {
	cl.t.Helper()
	var n v1alpha1.Raid10Node
	if err := cl.c.Get(cl.t.Context(), client.ObjectKey{Name: name}, &n); err != nil {
		cl.t.Fatal(err)
	}
	return &n
}

// diskID is the Raid10Node id of the pool disk at path.
func (cl *cluster) diskID(path string) string {
	cl.t.Helper()
	for _, d := range cl.node(clusterNode).Status.Disks {
		if d.Path == path {
			return d.ID
		}
	}
	cl.t.Fatalf("no disk %s in the Raid10Node", path)
	return ""
}

// lineIndex is the index of the first line of out that starts with prefix, or -1.
func lineIndex(out, prefix string) int {
	for i, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return i
		}
	}
	return -1
}

func lineOf(out, prefix string) string {
	if i := lineIndex(out, prefix); i >= 0 {
		return strings.Split(out, "\n")[i]
	}
	return ""
}

// check proves the pool consistent (pool.Check: labels, extents, and a scrub of each Healthy
// volume finding no mismatch) with the volume's scrub unthrottled meanwhile: at rebuildSlow
// the check of its 64 MiB alone took 16 s.
func (cl *cluster) check(volume, when string) {
	cl.t.Helper()
	if err := cl.pool.SetVolumeRates(volume, raid10.Rates{ScrubMax: 1 << 40}); err != nil {
		cl.t.Fatal(err)
	}
	defer func() {
		if err := cl.pool.SetVolumeRates(volume, raid10.Rates{}); err != nil {
			cl.t.Error(err)
		}
	}()
	if err := cl.pool.Check(); err != nil {
		cl.t.Fatalf("pool check %s: %v", when, err)
	}
}
