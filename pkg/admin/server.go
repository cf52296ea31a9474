package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/sockfile"
)

// SocketName is the admin socket's file name in its directory (the standalone agent's
// --run-dir, the plugin's --state-dir).
const SocketName = "admin.sock"

// Socket is the admin socket in dir.
func Socket(dir string) string { return filepath.Join(dir, SocketName) }

// VolumeOps is what a process that serves its volumes itself adds to the pool's volume
// operations (the standalone agent: an NBD export per volume). The plugin leaves it nil:
// there volumes are made through CSI, which keeps records the pool does not hold.
type VolumeOps interface {
	// Created is called after a volume was created (or found the same).
	Created(name string) error
	// Deleting is called before a volume is deleted.
	Deleting(name string)
	// Expanded is called after a volume grew.
	Expanded(name string) error
}

// Server answers the admin socket over a pool.
type Server struct {
	api  Direct
	vols VolumeOps
	srv  *http.Server
	ln   *sockfile.Listener // removes only the socket file it made
}

// Listen creates the admin socket at path (mode 0600, replacing a stale one) and returns
// the server that will answer it over p; vols may be nil (volume create, delete and expand
// then fail with pool.ErrFailedPrecondition).
func Listen(path string, p *pool.Pool, vols VolumeOps) (*Server, error) {
	// A successor process (a plugin restarted beside this one) replaces the file: this one
	// then leaves it alone when it stops (pkg/sockfile). Not umask: it is the whole
	// process's, and the plugin creates files meanwhile. Until the chmod the socket has the
	// process's default mode; the directories it is made in are 0700 (run dir, state dir),
	// so no one else reaches it meanwhile.
	ln, err := sockfile.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		_ = ln.Remove()
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	s := &Server{api: Direct{p}, vols: vols, ln: ln}
	s.srv = &http.Server{Handler: s.mux(), ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// Addr is the socket's path.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve answers requests until ctx ends, then stops (requests in progress get 10 s) and
// removes the socket file unless another process has replaced it meanwhile.
func (s *Server) Serve(ctx context.Context) error {
	defer s.unlink()
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin socket: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) && err == nil {
		err = e
	}
	return err
}

// Close closes a server that was never served.
func (s *Server) Close() error {
	defer s.unlink()
	return s.ln.Close()
}

func (s *Server) unlink() {
	if err := s.ln.Remove(); err != nil {
		klog.ErrorS(err, "Admin socket")
	}
}

var errNoVolumeOps = fmt.Errorf("%w: volumes are created, deleted and expanded through CSI in this process (kubectl raid10 or the PVC); the admin socket only reads them", pool.ErrFailedPrecondition)

func (s *Server) mux() *http.ServeMux {
	m := http.NewServeMux()
	handle := func(op string, f func(ctx context.Context, req DiskRequest, cr CreateRequest) (any, error)) {
		m.HandleFunc("POST /v1/"+op, func(w http.ResponseWriter, r *http.Request) {
			var req DiskRequest
			var cr CreateRequest
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
	handle("status", func(ctx context.Context, _ DiskRequest, _ CreateRequest) (any, error) {
		return s.api.Status(ctx)
	})
	handle("volumes/create", func(ctx context.Context, _ DiskRequest, cr CreateRequest) (any, error) {
		if s.vols == nil {
			return nil, errNoVolumeOps
		}
		v, err := s.api.CreateVolume(ctx, cr)
		if err != nil {
			return nil, err
		}
		return v, s.vols.Created(v.Name)
	})
	handle("volumes/delete", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		if s.vols == nil {
			return nil, errNoVolumeOps
		}
		s.vols.Deleting(req.Name)
		return struct{}{}, s.api.DeleteVolume(ctx, req.Name)
	})
	handle("volumes/expand", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		if s.vols == nil {
			return nil, errNoVolumeOps
		}
		v, err := s.api.ExpandVolume(ctx, req.Name, req.Size)
		if err != nil {
			return nil, err
		}
		return v, s.vols.Expanded(req.Name)
	})
	handle("disks/fail", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		return struct{}{}, s.api.FailDisk(ctx, req.Ref)
	})
	handle("disks/replace", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		return s.api.ReplaceDisk(ctx, req.Ref, req.Disk)
	})
	handle("disks/add", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		return s.api.AddDisk(ctx, req.Disk)
	})
	handle("disks/readd", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		return s.api.ReaddDisk(ctx, req.Ref)
	})
	handle("scrubs/start", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		return s.api.StartScrub(ctx, req.Name, req.Kind)
	})
	handle("scrubs/stop", func(ctx context.Context, req DiskRequest, _ CreateRequest) (any, error) {
		return s.api.StopScrub(ctx, req.Name)
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
