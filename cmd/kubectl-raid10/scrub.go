package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// scrubFlags are the flags of `scrub` in both modes.
type scrubFlags struct {
	repair, follow, stop, all bool
	node                      string
	timeout                   time.Duration
}

func (f *scrubFlags) register(fs *flag.FlagSet, cluster bool) {
	fs.BoolVar(&f.repair, "repair", false, "repair: rewrite the second copy of each block whose copies differ (default: check, count only)")
	fs.BoolVar(&f.follow, "follow", false, "print the progress until the scrub ends")
	fs.DurationVar(&f.timeout, "timeout", 24*time.Hour, "with --follow: give up after this long")
	if cluster {
		fs.StringVar(&f.node, "node", "", "scrub every volume of this node")
	} else {
		fs.BoolVar(&f.all, "all", false, "scrub every volume of this node")
		fs.BoolVar(&f.stop, "stop", false, "pause the running scrub instead (a later scrub of the same kind continues it where the engine can)")
	}
}

func (f *scrubFlags) kind() pool.ScrubKind {
	if f.repair {
		return pool.ScrubRepair
	}
	return pool.ScrubCheck
}

// runLocalScrub is `scrub VOLUME|--all [--repair] [--follow] [--stop]` through the node's
// admin socket (or the pool opened here, when nothing runs: then --follow is implied, since
// the scrub ends with this process).
func runLocalScrub(ctx context.Context, o *Options, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("scrub", flag.ContinueOnError)
	fs.StringVar(&o.Output, "o", o.Output, "output format: table, json or yaml")
	var f scrubFlags
	f.register(fs, false)
	pos, err := parseArgs(fs, args, 0, 1, "scrub VOLUME|--all [--repair] [--follow] [--stop]")
	if err != nil {
		return err
	}
	if (len(pos) == 1) == f.all {
		return fmt.Errorf("usage: scrub VOLUME|--all [--repair] [--follow] [--stop]: name one volume or --all")
	}
	if err := o.Validate(); err != nil {
		return err
	}
	api, err := connect(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = api.Close() }()
	if _, direct := api.(admin.Direct); direct {
		f.follow = true
	}
	names := pos
	if f.all {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		names = nil
		for _, v := range s.Volumes {
			names = append(names, v.Name)
		}
	}
	r := renderer{o: o, w: out}
	for _, name := range names {
		var sc pool.ScrubInfo
		if f.stop {
			sc, err = api.StopScrub(ctx, name)
		} else {
			sc, err = api.StartScrub(ctx, name, f.kind())
		}
		if err != nil {
			return fmt.Errorf("volume %s: %w", name, err)
		}
		if !f.follow {
			if err := printScrub(r, name, sc); err != nil {
				return err
			}
		}
	}
	if !f.follow || f.stop {
		return nil
	}
	return followScrubs(ctx, r, names, f.timeout, func(ctx context.Context) ([]pool.VolumeInfo, error) {
		s, err := api.Status(ctx)
		return s.Volumes, err
	})
}

// scrubLine is one line of a scrub's state.
func scrubLine(name string, sc pool.ScrubInfo) string {
	line := fmt.Sprintf("%s: %s %s %5.1f%% (%s of %s", name, sc.Kind, sc.State, sc.Percent, human(uint64(sc.Done)), human(uint64(sc.Total)))
	if sc.State == pool.ScrubRunning && sc.Rate > 0 {
		line += fmt.Sprintf(", %s/s, ETA %s", human(uint64(sc.Rate)), sc.ETA.Round(time.Second))
	}
	line += fmt.Sprintf("), %d mismatches", sc.Mismatches)
	if sc.Kind == pool.ScrubRepair {
		line += fmt.Sprintf(", %d repaired", sc.Repaired)
	}
	if sc.Lost > 0 {
		line += fmt.Sprintf(", %d lost", sc.Lost)
	}
	if sc.Error != "" {
		line += ": " + sc.Error
	}
	return line
}

func printScrub(r renderer, name string, sc pool.ScrubInfo) error {
	switch r.o.Output {
	case "json":
		return json.NewEncoder(r.w).Encode(map[string]any{"volume": name, "scrub": sc})
	case "yaml":
		if _, err := fmt.Fprintln(r.w, "---"); err != nil {
			return err
		}
		_, err := r.structured(map[string]any{"volume": name, "scrub": sc})
		return err
	}
	_, err := fmt.Fprintln(r.w, scrubLine(name, sc))
	return err
}

// followScrubs polls the volumes' scrubs, printing a line whenever one changes, until none
// runs. It fails when a scrub failed or the timeout passed.
func followScrubs(ctx context.Context, r renderer, names []string, timeout time.Duration, list func(context.Context) ([]pool.VolumeInfo, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := map[string]string{}
	for {
		vols, err := list(ctx)
		if err != nil {
			return err
		}
		running, failed := false, ""
		for _, name := range names {
			var sc *pool.ScrubInfo
			for i := range vols {
				if vols[i].Name == name {
					sc = vols[i].Scrub
				}
			}
			if sc == nil {
				continue
			}
			line := scrubLine(name, *sc)
			if sc.State == pool.ScrubRunning {
				running = true
				line = fmt.Sprintf("%s: %s %s %3.0f%%", name, sc.Kind, sc.State, sc.Percent) // a line per whole percent
			}
			if line != last[name] {
				if err := printScrub(r, name, *sc); err != nil {
					return err
				}
				last[name] = line
			}
			if sc.State == pool.ScrubFailed {
				failed = name
			}
		}
		if !running {
			if failed != "" {
				return fmt.Errorf("scrub of volume %s failed", failed)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("scrub still running after %s", timeout)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
