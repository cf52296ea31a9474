package pool

import (
	"time"

	"k8s.io/klog/v2"
)

// EventKind names what happened.
type EventKind string

// Event kinds. The CSI layer turns them into Kubernetes Events (DiskFailed, Degraded,
// RebuildStarted, RebuildFinished).
const (
	// EventDiskFailed: a disk was marked failed (I/O errors or an operator).
	EventDiskFailed EventKind = "DiskFailed"
	// EventDiskReplaced: a disk's volumes moved to another disk (replace or hot spare).
	EventDiskReplaced EventKind = "DiskReplaced"
	// EventVolumeHealth: a volume's health changed (Previous to Health); the first
	// observation of a volume that is not Healthy is reported too, with Previous "".
	EventVolumeHealth EventKind = "VolumeHealth"
)

// Event is one change the pool observed.
type Event struct {
	Kind     EventKind `json:"kind"`
	Time     time.Time `json:"time"`
	Disk     string    `json:"disk,omitempty"`     // disk UUID
	DiskPath string    `json:"diskPath,omitempty"` // its path, when present
	Volume   string    `json:"volume,omitempty"`   // volume name
	Health   Health    `json:"health,omitempty"`
	Previous Health    `json:"previous,omitempty"`
	Message  string    `json:"message,omitempty"`
}

// eventBuffer is how many events wait for a slow reader before new ones are dropped.
const eventBuffer = 256

// Events returns the channel the pool sends its events on, for one reader. Health changes
// are seen by the monitor within monitorInterval (250 ms). When the reader falls behind by
// more than 256 events, later ones are dropped (and logged); the state is always
// available from Status.
func (p *Pool) Events() <-chan Event { return p.events }

// emit queues an event without blocking. Caller holds p.mu.
func (p *Pool) emit(e Event) {
	e.Time = time.Now()
	select {
	case p.events <- e:
	default:
		klog.V(1).InfoS("Event dropped, reader behind", "kind", e.Kind, "volume", e.Volume, "disk", e.Disk)
	}
}

// observeHealth emits an event for every volume whose health changed since the last
// observation. Caller holds p.mu.
func (p *Pool) observeHealth() {
	for u, v := range p.volumes {
		h, _ := p.health(v)
		prev, seen := p.lastHealth[u]
		if (!seen && h != Healthy) || (seen && prev != h) {
			p.emit(Event{Kind: EventVolumeHealth, Volume: v.name, Health: h, Previous: prev})
		}
		p.lastHealth[u] = h
	}
	for u := range p.lastHealth {
		if p.volumes[u] == nil {
			delete(p.lastHealth, u)
		}
	}
}
