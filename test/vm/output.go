package vm

import (
	"bytes"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// followFile copies what is appended to the file at p to w (if non-nil) until stop
// is closed, then drains it and returns the whole content.
func followFile(p string, w io.Writer, stop <-chan struct{}) []byte {
	var all bytes.Buffer
	var f *os.File
	defer func() {
		if f != nil {
			_ = f.Close()
		}
	}()
	buf := make([]byte, 64<<10)
	drain := func() {
		if f == nil {
			var err error
			if f, err = os.Open(p); err != nil {
				return
			}
		}
		for {
			n, err := f.Read(buf)
			if n > 0 {
				all.Write(buf[:n])
				if w != nil {
					_, _ = w.Write(buf[:n]) // a failing reader must not stop the capture
				}
			}
			if err != nil || n == 0 {
				return
			}
		}
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			drain()
			return all.Bytes()
		case <-t.C:
			drain()
		}
	}
}

// syncBuffer collects the console and notes when marker first appears in it.
type syncBuffer struct {
	mu       sync.Mutex
	b        bytes.Buffer
	marker   []byte
	markerAt time.Time
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.b.Write(bytes.ReplaceAll(p, []byte("\r"), nil))
	if s.markerAt.IsZero() && len(s.marker) > 0 {
		// Only the last few KiB can hold a marker split across writes.
		tail := s.b.Bytes()
		if len(tail) > len(p)+len(s.marker) {
			tail = tail[len(tail)-len(p)-len(s.marker):]
		}
		if bytes.Contains(tail, s.marker) {
			s.markerAt = time.Now()
		}
	}
	return len(p), err
}

// marked reports whether the marker has been written.
func (s *syncBuffer) marked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.markerAt.IsZero()
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func tailLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
