package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// Client talks to a running process over its admin socket.
type Client struct {
	c *http.Client
}

var _ API = (*Client)(nil)

// Dial returns a client for the admin socket, or an error if nothing answers there.
func Dial(ctx context.Context, socket string) (*Client, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}}
	h := &Client{c: &http.Client{Transport: tr, Timeout: 5 * time.Minute}}
	if _, err := h.Status(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return h, nil
}

func (h *Client) call(ctx context.Context, op string, in, out any) error {
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

// Status implements API.
func (h *Client) Status(ctx context.Context) (s pool.Status, err error) {
	return s, h.call(ctx, "status", nil, &s)
}

// CreateVolume implements API.
func (h *Client) CreateVolume(ctx context.Context, r CreateRequest) (v pool.VolumeInfo, err error) {
	return v, h.call(ctx, "volumes/create", r, &v)
}

// DeleteVolume implements API.
func (h *Client) DeleteVolume(ctx context.Context, name string) error {
	return h.call(ctx, "volumes/delete", DiskRequest{Name: name}, nil)
}

// ExpandVolume implements API.
func (h *Client) ExpandVolume(ctx context.Context, name string, size uint64) (v pool.VolumeInfo, err error) {
	return v, h.call(ctx, "volumes/expand", DiskRequest{Name: name, Size: size}, &v)
}

// FailDisk implements API.
func (h *Client) FailDisk(ctx context.Context, ref string) error {
	return h.call(ctx, "disks/fail", DiskRequest{Ref: ref}, nil)
}

// ReplaceDisk implements API.
func (h *Client) ReplaceDisk(ctx context.Context, ref string, with pool.DiskConfig) (d pool.DiskInfo, err error) {
	return d, h.call(ctx, "disks/replace", DiskRequest{Ref: ref, Disk: with}, &d)
}

// AddDisk implements API.
func (h *Client) AddDisk(ctx context.Context, dc pool.DiskConfig) (d pool.DiskInfo, err error) {
	return d, h.call(ctx, "disks/add", DiskRequest{Disk: dc}, &d)
}

// ReaddDisk implements API.
func (h *Client) ReaddDisk(ctx context.Context, ref string) (d pool.DiskInfo, err error) {
	return d, h.call(ctx, "disks/readd", DiskRequest{Ref: ref}, &d)
}

// StartScrub implements API.
func (h *Client) StartScrub(ctx context.Context, name string, kind pool.ScrubKind) (s pool.ScrubInfo, err error) {
	return s, h.call(ctx, "scrubs/start", DiskRequest{Name: name, Kind: kind}, &s)
}

// StopScrub implements API.
func (h *Client) StopScrub(ctx context.Context, name string) (s pool.ScrubInfo, err error) {
	return s, h.call(ctx, "scrubs/stop", DiskRequest{Name: name}, &s)
}

// Close releases the client's connections.
func (h *Client) Close() error {
	h.c.CloseIdleConnections()
	return nil
}
