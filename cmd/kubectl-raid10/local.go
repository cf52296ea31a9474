package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// connect returns the API of the process that holds the pool (the standalone agent's admin
// socket in --run-dir, else the plugin's in --state-dir), or the pool opened in this process
// when neither answers and a pool configuration is given.
func connect(ctx context.Context, o *Options) (admin.API, error) {
	var socks []string
	for _, dir := range []string{o.RunDir, o.StateDir} {
		if dir == "" {
			continue
		}
		sock := admin.Socket(dir)
		socks = append(socks, sock)
		if _, err := os.Stat(sock); err != nil {
			continue
		}
		h, err := admin.Dial(ctx, sock)
		if err == nil {
			return h, nil
		}
		if o.PoolConfig == "" {
			return nil, fmt.Errorf("agent at %s does not answer: %w", sock, err)
		}
	}
	if o.PoolConfig == "" {
		return nil, fmt.Errorf("no node agent at %s and no --pool-config to open the pool directly", strings.Join(socks, " or "))
	}
	cfg, err := pool.LoadConfig(o.PoolConfig)
	if err != nil {
		return nil, err
	}
	// The plugin's record of the disks given at run time, when its state directory is here:
	// the same disks, and a disk replaced now is found by the plugin's next start.
	if st, err := os.Stat(o.StateDir); cfg.DisksFile == "" && o.StateDir != "" && err == nil && st.IsDir() {
		cfg.DisksFile = filepath.Join(o.StateDir, pool.DisksFileName)
	}
	p, err := pool.Open(cfg)
	if err != nil {
		return nil, err
	}
	return admin.Direct{P: p}, nil
}

// parseArgs parses flags anywhere among the positional arguments and checks their count.
func parseArgs(fs *flag.FlagSet, args []string, minPos, maxPos int, what string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(pos) < minPos || len(pos) > maxPos {
		return nil, fmt.Errorf("usage: %s", what)
	}
	return pos, nil
}

// runLocal executes a local-mode command.
func runLocal(ctx context.Context, o *Options, args []string, out io.Writer) error {
	cmd, rest := args[0], args[1:]
	if cmd == "serve" {
		if _, err := parseArgs(flag.NewFlagSet("serve", flag.ContinueOnError), rest, 0, 0, "serve"); err != nil {
			return err
		}
		if o.PoolConfig == "" {
			return errors.New("serve: --pool-config is required")
		}
		return runServe(ctx, o)
	}
	if cmd == "scrub" {
		return runLocalScrub(ctx, o, rest, out)
	}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.StringVar(&o.Output, "o", o.Output, "output format: table, json or yaml")
	var (
		members     int
		wipe, spare bool
		forHealth   string
		timeout     time.Duration
		pos         []string
		err         error
	)
	switch cmd {
	case "status", "disks":
		pos, err = parseArgs(fs, rest, 0, 0, cmd)
	case "volumes":
		pos, err = parseArgs(fs, rest, 0, 1, "volumes [NAME]")
	case "snapshots":
		pos, err = parseArgs(fs, rest, 0, 1, "snapshots [VOLUME]")
	case "create":
		fs.IntVar(&members, "members", 0, "member disks (default: every active disk)")
		pos, err = parseArgs(fs, rest, 2, 2, "create NAME SIZE [--members N]")
	case "delete":
		pos, err = parseArgs(fs, rest, 1, 1, "delete NAME")
	case "expand":
		pos, err = parseArgs(fs, rest, 2, 2, "expand NAME SIZE")
	case "wait":
		fs.StringVar(&forHealth, "for", string(pool.Healthy), "health to wait for")
		fs.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after this long")
		pos, err = parseArgs(fs, rest, 1, 1, "wait NAME [--for Healthy] [--timeout 10m]")
	case "disk":
		if len(rest) == 0 {
			return errors.New("usage: disk fail|replace|add|readd ... (see kubectl-raid10 help)")
		}
		cmd, rest = "disk "+rest[0], rest[1:]
		switch cmd {
		case "disk fail", "disk readd":
			pos, err = parseArgs(fs, rest, 1, 1, cmd+" DISK")
		case "disk replace":
			fs.BoolVar(&wipe, "wipe", false, "erase a foreign signature on the new disk")
			pos, err = parseArgs(fs, rest, 2, 2, "disk replace DISK NEWPATH [--wipe]")
		case "disk add":
			fs.BoolVar(&wipe, "wipe", false, "erase a foreign signature on the disk")
			fs.BoolVar(&spare, "spare", false, "add as a hot spare")
			pos, err = parseArgs(fs, rest, 1, 1, "disk add PATH [--spare] [--wipe]")
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
	default:
		return fmt.Errorf("unknown command %q (see kubectl-raid10 help)", cmd)
	}
	if err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	api, err := connect(ctx, o)
	if err != nil {
		return err
	}
	defer func() { _ = api.Close() }()
	r := renderer{o: o, w: out}
	switch cmd {
	case "status":
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		return r.status(s)
	case "disks":
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		return r.disks(s.Disks)
	case "snapshots":
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		source := ""
		if len(pos) == 1 {
			source = pos[0]
		}
		return r.localSnapshots(s.Snapshots, source)
	case "volumes":
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		vs := s.Volumes
		if len(pos) == 1 {
			vs = nil
			for _, v := range s.Volumes {
				if v.Name == pos[0] {
					vs = append(vs, v)
				}
			}
			if len(vs) == 0 {
				return fmt.Errorf("%w: volume %q", pool.ErrNotFound, pos[0])
			}
		}
		return r.volumes(vs)
	case "create", "expand":
		size, err := parseSize(pos[1])
		if err != nil {
			return err
		}
		var v pool.VolumeInfo
		if cmd == "create" {
			v, err = api.CreateVolume(ctx, admin.CreateRequest{Name: pos[0], Size: size, Members: members})
		} else {
			v, err = api.ExpandVolume(ctx, pos[0], size)
		}
		if err != nil {
			return err
		}
		return r.volumes([]pool.VolumeInfo{v})
	case "delete":
		if err := api.DeleteVolume(ctx, pos[0]); err != nil {
			return err
		}
		return r.done(fmt.Sprintf("volume %s deleted", pos[0]))
	case "wait":
		return waitFor(ctx, api, r, pos[0], pool.Health(forHealth), timeout)
	case "disk fail":
		if err := api.FailDisk(ctx, pos[0]); err != nil {
			return err
		}
		return r.done(fmt.Sprintf("disk %s marked failed", pos[0]))
	case "disk replace":
		d, err := api.ReplaceDisk(ctx, pos[0], pool.DiskConfig{Path: pos[1], Wipe: wipe})
		if err != nil {
			return err
		}
		return r.disks([]pool.DiskInfo{d})
	case "disk add":
		d, err := api.AddDisk(ctx, pool.DiskConfig{Path: pos[0], Wipe: wipe, Spare: spare})
		if err != nil {
			return err
		}
		return r.disks([]pool.DiskInfo{d})
	case "disk readd":
		d, err := api.ReaddDisk(ctx, pos[0])
		if err != nil {
			return err
		}
		return r.disks([]pool.DiskInfo{d})
	}
	return nil
}

// waitFor polls a volume until it reaches the wanted health, printing a line whenever its
// health or rebuild progress changes.
func waitFor(ctx context.Context, api admin.API, r renderer, name string, want pool.Health, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		s, err := api.Status(ctx)
		if err != nil {
			return err
		}
		var v *pool.VolumeInfo
		for i := range s.Volumes {
			if s.Volumes[i].Name == name {
				v = &s.Volumes[i]
			}
		}
		if v == nil {
			return fmt.Errorf("%w: volume %q", pool.ErrNotFound, name)
		}
		line := fmt.Sprintf("%s: %s, %d/%d members in sync", v.Name, v.Health, v.InSync, len(v.Members))
		if p := v.Sync; p != nil {
			line += fmt.Sprintf(", %s %5.1f%% (%s of %s, %s/s, ETA %s)", p.Kind, p.Percent,
				human(uint64(p.Done)), human(uint64(p.Total)), human(uint64(p.Rate)), p.ETA.Round(time.Second))
		}
		if line != last {
			var err error
			switch r.o.Output {
			case "json": // one object a line, as it comes
				err = json.NewEncoder(r.w).Encode(v)
			case "yaml": // one document each
				if _, err = fmt.Fprintln(r.w, "---"); err == nil {
					_, err = r.structured(v)
				}
			default:
				_, err = fmt.Fprintln(r.w, line)
			}
			if err != nil {
				return err
			}
			last = line
		}
		if v.Health == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("volume %s is %s after %s, waited for %s", name, v.Health, timeout, want)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// parseSize reads 10Gi, 512Mi, 4Ki, 1G, 100M, 1T or a byte count.
func parseSize(s string) (uint64, error) {
	units := []struct {
		suffix string
		mult   uint64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	mult := uint64(1)
	num := s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n == 0 || n > (1<<63)/mult {
		return 0, fmt.Errorf("%w: size %q: a positive number with an optional unit (Ki, Mi, Gi, Ti, K, M, G, T)", pool.ErrInvalidArgument, s)
	}
	return n * mult, nil
}
