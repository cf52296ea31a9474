package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/nbd"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// agent is the standalone node agent of `kubectl-raid10 local serve`: it holds the pool,
// serves every volume over NBD on <run-dir>/nbd/<volume>.sock and answers the local
// subcommands on <run-dir>/admin.sock (JSON over HTTP on a unix socket, mode 0600).
type agent struct {
	p      *pool.Pool
	api    direct
	nbdDir string

	mu      sync.Mutex // guards exports
	exports map[string]*nbd.Server
}

func adminSocket(runDir string) string { return filepath.Join(runDir, "admin.sock") }

// NBDSocket is where the agent serves a volume.
func nbdSocket(runDir, volume string) string {
	return filepath.Join(runDir, "nbd", volume+".sock")
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
	a := &agent{p: p, api: direct{p}, nbdDir: filepath.Join(o.RunDir, "nbd"), exports: map[string]*nbd.Server{}}
	for _, v := range p.Volumes() {
		if err := a.export(v.Name); err != nil {
			klog.ErrorS(err, "Volume not served", "volume", v.Name)
		}
	}
	sock := adminSocket(o.RunDir)
	if err := os.Remove(sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		_ = p.Close()
		return fmt.Errorf("admin socket: %w", err)
	}
	srv := &http.Server{Handler: a.mux(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Admin server stopped")
		}
	}()
	klog.InfoS("Node agent ready", "pool", p.UUID(), "admin", sock, "nbdDir", a.nbdDir)
	<-ctx.Done()
	klog.InfoS("Node agent stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	a.mu.Lock()
	for name, s := range a.exports {
		_ = s.Shutdown(sctx)
		delete(a.exports, name)
	}
	a.mu.Unlock()
	return p.Close()
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

func (a *agent) mux() *http.ServeMux {
	m := http.NewServeMux()
	handle := func(op string, f func(ctx context.Context, req diskRequest, cr createRequest) (any, error)) {
		m.HandleFunc("POST /v1/"+op, func(w http.ResponseWriter, r *http.Request) {
			var req diskRequest
			var cr createRequest
			if r.ContentLength != 0 {
				dec := json.NewDecoder(r.Body)
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					writeErr(w, fmt.Errorf("%w: %w", pool.ErrInvalidArgument, err))
					return
				}
				_ = json.Unmarshal(raw, &req)
				_ = json.Unmarshal(raw, &cr)
			}
			out, err := f(r.Context(), req, cr)
			if err != nil {
				klog.ErrorS(err, "Admin request failed", "op", op)
				writeErr(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
		})
	}
	handle("status", func(ctx context.Context, _ diskRequest, _ createRequest) (any, error) {
		return a.api.Status(ctx)
	})
	handle("volumes/create", func(ctx context.Context, _ diskRequest, cr createRequest) (any, error) {
		v, err := a.api.CreateVolume(ctx, cr)
		if err != nil {
			return nil, err
		}
		return v, a.export(v.Name)
	})
	handle("volumes/delete", func(ctx context.Context, req diskRequest, _ createRequest) (any, error) {
		a.unexport(req.Name)
		return struct{}{}, a.api.DeleteVolume(ctx, req.Name)
	})
	handle("volumes/expand", func(ctx context.Context, req diskRequest, _ createRequest) (any, error) {
		v, err := a.api.ExpandVolume(ctx, req.Name, req.Size)
		if err != nil {
			return nil, err
		}
		a.unexport(req.Name) // the export's size is fixed: clients reconnect to see the new one
		return v, a.export(req.Name)
	})
	handle("disks/fail", func(ctx context.Context, req diskRequest, _ createRequest) (any, error) {
		return struct{}{}, a.api.FailDisk(ctx, req.Ref)
	})
	handle("disks/replace", func(ctx context.Context, req diskRequest, _ createRequest) (any, error) {
		return a.api.ReplaceDisk(ctx, req.Ref, req.Disk)
	})
	handle("disks/add", func(ctx context.Context, req diskRequest, _ createRequest) (any, error) {
		return a.api.AddDisk(ctx, req.Disk)
	})
	handle("disks/readd", func(ctx context.Context, req diskRequest, _ createRequest) (any, error) {
		return a.api.ReaddDisk(ctx, req.Ref)
	})
	return m
}

func writeErr(w http.ResponseWriter, err error) {
	code := codeOf(err)
	status := http.StatusInternalServerError
	switch code {
	case "InvalidArgument":
		status = http.StatusBadRequest
	case "NotFound":
		status = http.StatusNotFound
	case "AlreadyExists":
		status = http.StatusConflict
	case "Internal":
	default:
		status = http.StatusPreconditionFailed
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wireError{Code: code, Message: err.Error()})
}
