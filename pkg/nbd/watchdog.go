package nbd

import "time"

// The watchdog passes the reader role of a connection to a new goroutine when the reader has
// been executing a request inline for more than a tick (see conn.role). One runs per Server
// while requests come in, and stops after watchIdle with no inline execution seen, so an idle
// server costs no wake-ups. It costs the I/O path one atomic load per inline request.
const (
	watchTick = 2 * time.Millisecond
	watchIdle = 50 // ticks
)

// watch starts the watchdog unless it runs. A reader calls it after marking its role inline.
func (s *Server) watch() {
	if s.watching.Load() || !s.watching.CompareAndSwap(false, true) {
		return
	}
	go s.watchdog()
}

// watchdog checks every connection each tick: one that has executed the same request inline
// since the previous tick, one to two ticks, loses its reader role to a new reader.
func (s *Server) watchdog() {
	t := time.NewTicker(watchTick)
	defer t.Stop()
	idle := 0
	for range t.C {
		if s.scan() {
			idle = 0
			continue
		}
		if idle++; idle < watchIdle {
			continue
		}
		// Stop, then look once more: a reader that marked its role inline before this store
		// either saw the watchdog running (and is seen by this scan) or starts a new one.
		s.watching.Store(false)
		if !s.scan() || !s.watching.CompareAndSwap(false, true) {
			return
		}
		idle = 0
	}
}

// scan takes over the readers stuck inline and reports whether any reader was inline.
func (s *Server) scan() bool {
	busy := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		v := c.role.Load()
		if v&1 == 1 {
			busy = true
			if v == c.watched {
				c.takeOver(v)
			}
		}
		c.watched = v
	}
	return busy
}
