// Command kubectl-raid10 is the kubectl plugin (`kubectl raid10 ...`) and the local admin tool
// of raid10-csi: it lists disks, volumes and their health, and replaces failed disks, either
// through the cluster's custom resources or directly on a node (--local).
//
// Cluster mode (the default) reads the Raid10Node and Raid10Volume resources and their
// events.k8s.io Events with the kubeconfig kubectl itself would use (--kubeconfig, else
// $KUBECONFIG, else ~/.kube/config; --context): status, volumes, disks, describe volume.
// Its writes: replace-disk sets the Raid10Node's spec.diskReplacement, which that node's
// agent carries out (pool.ReplaceDisk) and answers in status.lastDiskReplacement; scrub sets
// a Raid10Volume's spec.scrub, answered in status.scrub.
//
// Local mode talks to the admin socket (pkg/admin) of the process that holds the node's pool
// when one runs: the standalone agent's <run-dir>/admin.sock, else the plugin's
// <state-dir>/admin.sock (--mode=node and --mode=all); otherwise it opens the pool itself
// from --pool-config. `kubectl-raid10 --local serve`
// is a standalone node agent: it opens the pool and serves every volume over NBD on
// <run-dir>/nbd/<volume>.sock (used by `make demo`; the CSI plugin's --mode=all is the
// agent of a real node).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
)

// Options holds the global command-line configuration.
type Options struct {
	// Local selects local mode: this node's pool, no cluster.
	Local bool
	// PoolConfig is the pool's JSON configuration (local mode, when no agent runs, and serve).
	PoolConfig string
	// RunDir holds the standalone agent's admin socket and NBD sockets.
	RunDir string
	// StateDir is the plugin's --state-dir, where it serves its admin socket (--mode=node
	// and --mode=all); tried after RunDir.
	StateDir string
	// Output is "table", "json" or "yaml".
	Output string
	// Kubeconfig is the kubeconfig file of cluster mode; empty: $KUBECONFIG, ~/.kube/config.
	Kubeconfig string
	// Context is the kubeconfig context of cluster mode; empty: the current one.
	Context string
}

// Validate reports the first invalid option, naming it.
func (o *Options) Validate() error {
	switch o.Output {
	case "table", "json", "yaml":
	default:
		return fmt.Errorf("-o=%q: must be table, json or yaml", o.Output)
	}
	if o.RunDir == "" {
		return errors.New("--run-dir: must not be empty")
	}
	return nil
}

const usage = `usage: kubectl raid10 [flags] <command> [args]

Modes:
  (default)      cluster mode, through the Raid10Volume/Raid10Node resources, with the
                 kubeconfig kubectl uses (--kubeconfig, $KUBECONFIG, ~/.kube/config)
  --local        this node's pool directly: through the admin socket of the process that
                 holds it (the standalone agent's in --run-dir, the plugin's in --state-dir),
                 or by opening the pool from --pool-config when nothing runs
                 (also written as a leading "local" command: kubectl raid10 local status)

Cluster commands (-o table|json|yaml):
  status                         nodes (disks healthy/total, usable, free) and volumes,
                                 failed, degraded and rebuilding ones first
  volumes [NAME]                 volumes, as kubectl get r10v, with rebuild progress bars
  disks [NODE]                   every node's disks: state, size, free
  snapshots [VOLUME]             snapshots (of VOLUME), as kubectl get r10s, with copy progress
  describe volume NAME           spec, status, source and copy, members, snapshots,
                                 conditions and recent Events
  replace-disk NODE OLD NEW [--wipe] [--follow] [--timeout 2m]
                                 ask NODE's agent to replace its Failed or Missing disk OLD
                                 (an id or path from "disks") by the blank disk at path NEW;
                                 the volumes on OLD rebuild onto NEW (--follow: print their
                                 progress until Healthy)
  scrub VOLUME|--node NODE [--repair] [--follow] [--timeout 24h]
                                 ask the volume's node agent for a check (compare the two
                                 copies, count mismatches) or repair: sets spec.scrub, the
                                 agent answers in status.scrub (--follow: progress to the end)

Local commands (--local):
  status                         pool capacity, disks and volumes
  disks                          list disks
  volumes [NAME]                 list volumes (or one)
  snapshots [VOLUME]             list snapshots (of VOLUME) with copy progress
  create NAME SIZE [--members N] create a volume (SIZE like 10Gi, 512Mi, 1G, bytes)
  delete NAME                    delete a volume
  expand NAME SIZE               grow a volume in place
  disk fail DISK                 mark a disk failed (DISK: UUID, its first 8 digits, path or serial/WWN)
  disk replace DISK NEWPATH [--wipe]
                                 replace a failed or missing disk; its volumes rebuild onto NEWPATH
  disk add PATH [--spare] [--wipe]
                                 add a disk (or bring back a missing one)
  disk readd DISK                put a failed disk that works again back (bitmap resync)
  scrub VOLUME|--all [--repair] [--follow] [--stop]
                                 check (compare the copies, count mismatches) or repair a
                                 volume in the background; --follow prints progress to the end
  wait NAME [--for Healthy] [--timeout 10m]
                                 wait for a volume's health, printing rebuild progress
  serve                          run the standalone node agent (local mode only)

Flags:
`

func main() {
	o := &Options{}
	fs := flag.NewFlagSet("kubectl-raid10", flag.ContinueOnError)
	fs.BoolVar(&o.Local, "local", os.Getenv("RAID10_LOCAL") == "1", "local mode: this node's pool, no cluster (env RAID10_LOCAL=1)")
	fs.StringVar(&o.PoolConfig, "pool-config", os.Getenv("RAID10_POOL_CONFIG"), "pool configuration (JSON) for serve and for local mode without an agent (env RAID10_POOL_CONFIG)")
	fs.StringVar(&o.RunDir, "run-dir", envOr("RAID10_RUN_DIR", "/run/raid10-csi"), "directory of the agent's admin and NBD sockets (env RAID10_RUN_DIR)")
	fs.StringVar(&o.StateDir, "state-dir", envOr("RAID10_STATE_DIR", "/var/lib/raid10-csi"), "the plugin's --state-dir, whose admin socket is used when none is in --run-dir (env RAID10_STATE_DIR)")
	fs.StringVar(&o.Output, "o", "table", "output format: table, json or yaml")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (cluster mode; default $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.Context, "context", "", "kubeconfig context (cluster mode; default the current context)")
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	fs.Var(kfs.Lookup("v").Value, "v", "log verbosity (serve)")
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		os.Exit(2)
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-raid10:", err)
		os.Exit(2)
	}
	args := fs.Args()
	if len(args) > 0 && args[0] == "local" { // `kubectl raid10 local <command>` reads as --local
		o.Local, args = true, args[1:]
	}
	if len(args) == 0 || args[0] == "help" {
		fs.Usage()
		return
	}
	if args[0] != "serve" {
		// Commands print their results; the pool's logs would only be noise on the terminal.
		_ = kfs.Set("logtostderr", "false")
		_ = kfs.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, o, args, os.Stdout)
	stop()
	exit(args[0], err)
}

// exit reports a command's error and sets the exit status.
func exit(cmd string, err error) {
	if err != nil {
		if cmd == "serve" {
			klog.ErrorS(err, "Node agent failed")
			klog.FlushAndExit(klog.ExitFlushTimeout, 1)
		}
		fmt.Fprintln(os.Stderr, "kubectl-raid10:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// run executes one command.
func run(ctx context.Context, o *Options, args []string, out io.Writer) error {
	if !o.Local {
		return runCluster(ctx, o, args, out)
	}
	return runLocal(ctx, o, args, out)
}
