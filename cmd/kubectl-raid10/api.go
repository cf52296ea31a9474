package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// localAPI is what the local subcommands need of a node's pool. Two implementations: the
// running agent's admin socket (httpAPI), or the pool opened in this process (direct) when
// no agent runs.
type localAPI interface {
	// Status snapshots the pool.
	Status(ctx context.Context) (pool.Status, error)
	// CreateVolume creates (or returns the same) volume.
	CreateVolume(ctx context.Context, r createRequest) (pool.VolumeInfo, error)
	// DeleteVolume deletes a volume; a missing one is success.
	DeleteVolume(ctx context.Context, name string) error
	// ExpandVolume grows a volume in place.
	ExpandVolume(ctx context.Context, name string, size uint64) (pool.VolumeInfo, error)
	// FailDisk marks a disk failed.
	FailDisk(ctx context.Context, ref string) error
	// ReplaceDisk replaces a failed or missing disk.
	ReplaceDisk(ctx context.Context, ref string, with pool.DiskConfig) (pool.DiskInfo, error)
	// AddDisk offers a disk to the pool.
	AddDisk(ctx context.Context, dc pool.DiskConfig) (pool.DiskInfo, error)
	// ReaddDisk puts a failed disk back.
	ReaddDisk(ctx context.Context, ref string) (pool.DiskInfo, error)
	// Close releases the API.
	Close() error
}

type createRequest struct {
	Name    string `json:"name"`
	Size    uint64 `json:"size"`
	Members int    `json:"members,omitempty"`
}

type diskRequest struct {
	Ref  string          `json:"ref,omitempty"`
	Disk pool.DiskConfig `json:"disk"`
	Size uint64          `json:"size,omitempty"`
	Name string          `json:"name,omitempty"`
}

// direct is the pool opened in this process.
type direct struct{ p *pool.Pool }

var _ localAPI = direct{}

func (d direct) Status(context.Context) (pool.Status, error) { return d.p.Status(), nil }
func (d direct) CreateVolume(_ context.Context, r createRequest) (pool.VolumeInfo, error) {
	return d.p.CreateVolume(r.Name, r.Size, pool.CreateOptions{Members: r.Members})
}
func (d direct) DeleteVolume(_ context.Context, name string) error { return d.p.DeleteVolume(name) }
func (d direct) ExpandVolume(_ context.Context, name string, size uint64) (pool.VolumeInfo, error) {
	return d.p.ExpandVolume(name, size)
}
func (d direct) FailDisk(_ context.Context, ref string) error { return d.p.FailDisk(ref) }
func (d direct) ReplaceDisk(_ context.Context, ref string, with pool.DiskConfig) (pool.DiskInfo, error) {
	return d.p.ReplaceDisk(ref, with)
}
func (d direct) AddDisk(_ context.Context, dc pool.DiskConfig) (pool.DiskInfo, error) {
	return d.p.AddDisk(dc)
}
func (d direct) ReaddDisk(_ context.Context, ref string) (pool.DiskInfo, error) {
	return d.p.ReaddDisk(ref)
}
func (d direct) Close() error { return d.p.Close() }

// errorCodes names the pool's sentinels on the wire, so the client side gets errors that
// match them with errors.Is again.
var errorCodes = []struct {
	code string
	err  error
}{
	{"InvalidArgument", pool.ErrInvalidArgument},
	{"NotFound", pool.ErrNotFound},
	{"AlreadyExists", pool.ErrAlreadyExists},
	{"NoSpace", pool.ErrNoSpace},
	{"ForeignSignature", pool.ErrForeignSignature},
	{"CorruptLabel", pool.ErrCorruptLabel},
	{"OtherPool", pool.ErrOtherPool},
	{"DiskInUse", pool.ErrDiskInUse},
	{"Degraded", pool.ErrDegraded},
	{"FailedPrecondition", pool.ErrFailedPrecondition},
	{"Closed", pool.ErrClosed},
}

type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func codeOf(err error) string {
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "Internal"
}

func (w wireError) err() error {
	for _, c := range errorCodes {
		if c.code == w.Code {
			return &remoteError{msg: w.Message, sentinel: c.err}
		}
	}
	return errors.New(w.Message)
}

// remoteError is an error the agent returned: its message as the agent wrote it, matching
// the pool sentinel its code names.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }

// Is makes errors.Is(err, pool.ErrX) work across the admin socket.
func (e *remoteError) Is(target error) bool { return target == e.sentinel }

// httpAPI talks to a running agent over its admin unix socket.
type httpAPI struct {
	c *http.Client
}

var _ localAPI = (*httpAPI)(nil)

// dialAgent returns a client for the agent's admin socket, or an error if none answers.
func dialAgent(ctx context.Context, socket string) (*httpAPI, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	h := &httpAPI{c: &http.Client{Transport: tr, Timeout: 5 * time.Minute}}
	if _, err := h.Status(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return h, nil
}

func (h *httpAPI) call(ctx context.Context, op string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/v1/"+op, body)
	if err != nil {
		return err
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var we wireError
		if json.Unmarshal(b, &we) != nil {
			return fmt.Errorf("agent: HTTP %d: %s", resp.StatusCode, b)
		}
		return we.err()
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

func (h *httpAPI) Status(ctx context.Context) (s pool.Status, err error) {
	return s, h.call(ctx, "status", nil, &s)
}
func (h *httpAPI) CreateVolume(ctx context.Context, r createRequest) (v pool.VolumeInfo, err error) {
	return v, h.call(ctx, "volumes/create", r, &v)
}
func (h *httpAPI) DeleteVolume(ctx context.Context, name string) error {
	return h.call(ctx, "volumes/delete", diskRequest{Name: name}, nil)
}
func (h *httpAPI) ExpandVolume(ctx context.Context, name string, size uint64) (v pool.VolumeInfo, err error) {
	return v, h.call(ctx, "volumes/expand", diskRequest{Name: name, Size: size}, &v)
}
func (h *httpAPI) FailDisk(ctx context.Context, ref string) error {
	return h.call(ctx, "disks/fail", diskRequest{Ref: ref}, nil)
}
func (h *httpAPI) ReplaceDisk(ctx context.Context, ref string, with pool.DiskConfig) (d pool.DiskInfo, err error) {
	return d, h.call(ctx, "disks/replace", diskRequest{Ref: ref, Disk: with}, &d)
}
func (h *httpAPI) AddDisk(ctx context.Context, dc pool.DiskConfig) (d pool.DiskInfo, err error) {
	return d, h.call(ctx, "disks/add", diskRequest{Disk: dc}, &d)
}
func (h *httpAPI) ReaddDisk(ctx context.Context, ref string) (d pool.DiskInfo, err error) {
	return d, h.call(ctx, "disks/readd", diskRequest{Ref: ref}, &d)
}
func (h *httpAPI) Close() error {
	h.c.CloseIdleConnections()
	return nil
}
