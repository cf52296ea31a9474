package crstatus

import (
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// EngineScrubSchedule is the pool's scrub schedule for a Raid10Volume's spec.scrubSchedule;
// the zero ScrubConfig (nil in) is the node's schedule. Every volume schedule has its
// Schedule set (the driver refuses one without), so no schedule of its own is zero. A window
// that does not parse (the driver checks it) stays 0, the pool's default.
func EngineScrubSchedule(s *v1alpha1.VolumeScrubSchedule) pool.ScrubConfig {
	if s == nil {
		return pool.ScrubConfig{}
	}
	w, _ := time.ParseDuration(s.Window)
	return pool.ScrubConfig{Schedule: s.Schedule, Start: s.Start, Window: pool.Duration(w), Repair: s.Repair}
}

// SetScrubSchedule puts c on the volume called name through set
// (pool.SetVolumeScrubSchedule): the zero ScrubConfig returns it to the node's schedule.
func SetScrubSchedule(set func(string, *pool.ScrubConfig) error, name string, c pool.ScrubConfig) error {
	if c == (pool.ScrubConfig{}) {
		return set(name, nil)
	}
	return set(name, &c)
}
