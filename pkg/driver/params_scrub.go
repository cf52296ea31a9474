package driver

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// A volume's scrub schedule of its own (docs/parameters.md, "Scrub schedule"): StorageClass
// parameters and mutable parameters, like the rates. They become the Raid10Volume's
// spec.scrubSchedule, which the node agent puts on the pool (pool.SetVolumeScrubSchedule).
// The keys are the node's scrub settings (node.pool.scrub: schedule, start, window, repair)
// with a scrub prefix. A volume's schedule is whole in itself: a key not given takes the
// pool's default (01:00, 6h, check only), never the node's value, so the class alone says
// what the volume gets; scrubSchedule "node" returns the volume to the node's schedule.
const (
	// ParamScrubSchedule is monthly, weekly, off (no scheduled scrub of this volume) or node.
	ParamScrubSchedule = "scrubSchedule"
	// ParamScrubStart is the time of day (HH:MM, the node's local time) the window opens.
	ParamScrubStart = "scrubStart"
	// ParamScrubWindow is how long a scheduled scrub runs each night (a duration, 4h).
	ParamScrubWindow = "scrubWindow"
	// ParamScrubRepair is true for scheduled scrubs that repair, false for checks.
	ParamScrubRepair = "scrubRepair"
)

// scrubNode is scrubSchedule's value that returns the volume to the node's schedule.
const scrubNode = "node"

// scrubParams sets each scrub key's field of a schedule from a value it has checked.
var scrubParams = map[string]func(*v1alpha1.VolumeScrubSchedule, string) error{
	ParamScrubSchedule: func(s *v1alpha1.VolumeScrubSchedule, v string) error {
		switch v {
		case "monthly", "weekly", "off", scrubNode:
			s.Schedule = v
			return nil
		}
		return fmt.Errorf("must be monthly, weekly, off or %s (the node's schedule)", scrubNode)
	},
	ParamScrubStart: func(s *v1alpha1.VolumeScrubSchedule, v string) error {
		if _, err := time.Parse("15:04", v); err != nil || len(v) != 5 {
			return fmt.Errorf("must be a time of day, HH:MM")
		}
		s.Start = v
		return nil
	},
	ParamScrubWindow: func(s *v1alpha1.VolumeScrubSchedule, v string) error {
		if d, err := time.ParseDuration(v); err != nil || d <= 0 || d > 24*time.Hour {
			return fmt.Errorf("must be a duration (4h) more than 0 and at most 24h")
		}
		s.Window = v
		return nil
	},
	ParamScrubRepair: func(s *v1alpha1.VolumeScrubSchedule, v string) error {
		switch v {
		case "true", "false":
			s.Repair = v == "true"
			return nil
		}
		return fmt.Errorf("must be true or false")
	},
}

// scrubParamNames lists the scrub keys, sorted, for error messages.
var scrubParamNames = strings.Join(slices.Sorted(maps.Keys(scrubParams)), ", ")

// setScrub is the one parser of a scrub key, for StorageClass and mutable parameters alike:
// it sets k's field of s from v. known is false when k is no scrub key (s untouched); a
// malformed value is an error wrapping ErrInvalidArgument naming k.
func setScrub(s *v1alpha1.VolumeScrubSchedule, k, v string) (known bool, err error) {
	set, ok := scrubParams[k]
	if !ok {
		return false, nil
	}
	if err := set(s, v); err != nil {
		return true, fmt.Errorf("parameter %s=%q: %w: %w", k, v, err, ErrInvalidArgument)
	}
	return true, nil
}

// parseMutableScrub applies the scrub keys of in over cur, the volume's schedule now (nil:
// the node's), and returns the result, nil for the node's. No scrub key in in: cur as it is
// (nothing is cleared by omission); scrubSchedule "node": nil, with no other scrub key
// beside it. A schedule of its own needs scrubSchedule, given now or before: scrubStart,
// scrubWindow or scrubRepair alone on a volume that follows the node's schedule are refused
// (they would otherwise turn on a monthly schedule nobody asked for). Keys that are no scrub
// key are skipped: parseMutableParams validates every key. Errors wrap ErrInvalidArgument
// and name the key.
func parseMutableScrub(in map[string]string, cur *v1alpha1.VolumeScrubSchedule) (*v1alpha1.VolumeScrubSchedule, error) {
	var s v1alpha1.VolumeScrubSchedule
	if cur != nil {
		s = *cur
	}
	var given []string
	for _, k := range slices.Sorted(maps.Keys(in)) {
		known, err := setScrub(&s, k, in[k])
		if err != nil {
			return nil, err
		}
		if known && k != ParamScrubSchedule {
			given = append(given, k)
		}
	}
	_, sched := in[ParamScrubSchedule]
	switch {
	case len(given) == 0 && !sched:
		return cur.DeepCopy(), nil
	case s.Schedule == scrubNode && len(given) > 0:
		return nil, fmt.Errorf("parameter %s: not with %s=%s (the node's schedule has its own): %w", given[0], ParamScrubSchedule, scrubNode, ErrInvalidArgument)
	case s.Schedule == scrubNode:
		return nil, nil
	case s.Schedule == "":
		return nil, fmt.Errorf("parameter %s: needs %s (monthly, weekly or off): the volume follows the node's schedule: %w", given[0], ParamScrubSchedule, ErrInvalidArgument)
	}
	return &s, nil
}
