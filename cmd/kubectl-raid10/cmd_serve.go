package main

// serve (local mode): the standalone node agent, which holds the pool and serves every
// volume over NBD (used by `make demo`; the CSI plugin's --mode=all is the agent of a real
// node).

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// agent is the standalone node agent of `kubectl-raid10 local serve`: it holds the pool,
// serves every volume over NBD on <run-dir>/nbd/<volume>.sock and answers the local
// subcommands on <run-dir>/admin.sock (JSON over HTTP on a unix socket, mode 0600).
type agent struct {
	p      *pool.Pool
	nbdDir string

	mu      sync.Mutex // guards exports
	exports map[string]*nbd.Server
}

var _ admin.VolumeOps = (*agent)(nil)

// nbdSocket is where the agent serves a volume.
func nbdSocket(runDir, volume string) string {
	return filepath.Join(runDir, "nbd", volume+".sock")
}

// serveCmd runs the agent until ctx ends; it needs --pool-config and takes no arguments.
func serveCmd(ctx context.Context, o *Options, args []string, _ io.Writer) error {
	if _, err := parseArgs(flag.NewFlagSet("serve", flag.ContinueOnError), args, 0, 0, "serve"); err != nil {
		return err
	}
	if o.PoolConfig == "" {
		return errors.New("serve: --pool-config is required")
	}
	return runServe(ctx, o)
}

// runServe runs the agent until ctx ends.
func runServe(ctx context.Context, o *Options) error {
	cfg, err := pool.LoadConfig(o.PoolConfig)
	if err != nil {
		return err
	}
	for _, dir := range []string{o.RunDir, filepath.Join(o.RunDir, "nbd")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return err
		}
	}
	p, err := pool.Open(cfg)
	if err != nil {
		return err
	}
	a := &agent{p: p, nbdDir: filepath.Join(o.RunDir, "nbd"), exports: map[string]*nbd.Server{}}
	for _, v := range p.Volumes() {
		if err := a.export(v.Name); err != nil {
			klog.ErrorS(err, "Volume not served", "volume", v.Name)
		}
	}
	srv, err := admin.Listen(admin.Socket(o.RunDir), p, a)
	if err != nil {
		_ = p.Close()
		return err
	}
	klog.InfoS("Node agent ready", "pool", p.UUID(), "admin", srv.Addr(), "nbdDir", a.nbdDir)
	err = srv.Serve(ctx)
	klog.InfoS("Node agent stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.mu.Lock()
	for name, s := range a.exports {
		_ = s.Shutdown(sctx)
		delete(a.exports, name)
	}
	a.mu.Unlock()
	return errors.Join(err, p.Close())
}

// Created implements admin.VolumeOps: a new volume is served at once.
func (a *agent) Created(name string) error { return a.export(name) }

// Deleting implements admin.VolumeOps.
func (a *agent) Deleting(name string) { a.unexport(name) }

// Expanded implements admin.VolumeOps: the export's size is fixed, so clients reconnect to
// see the new one.
func (a *agent) Expanded(name string) error {
	a.unexport(name)
	return a.export(name)
}

// export starts serving a volume over NBD (the default export of its socket).
func (a *agent) export(name string) error {
	arr, err := a.p.Array(name)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.exports[name] != nil {
		return nil
	}
	s, err := nbd.NewVolumeServer(name, arr)
	if err != nil {
		return err
	}
	ln, err := nbd.Listen(filepath.Join(a.nbdDir, name+".sock"))
	if err != nil {
		return err
	}
	a.exports[name] = s
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, nbd.ErrServerClosed) {
			klog.ErrorS(err, "NBD server stopped", "volume", name)
		}
	}()
	klog.InfoS("Volume served over NBD", "volume", name, "socket", ln.Addr().String())
	return nil
}

// unexport stops serving a volume, letting in-flight requests finish.
func (a *agent) unexport(name string) {
	a.mu.Lock()
	s := a.exports[name]
	delete(a.exports, name)
	a.mu.Unlock()
	if s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	}
}
