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
// from --pool-config. `kubectl-raid10 --local serve` is a standalone node agent: it opens
// the pool and serves every volume over NBD on <run-dir>/nbd/<volume>.sock (used by `make
// demo`; the CSI plugin's --mode=all is the agent of a real node).
//
// The files: main.go holds the options, the two dispatch tables (clusterCommands,
// localCommands), from which help is written, and the argument parsing; cmd_<command>.go
// one command (or group) in both modes; client.go the API clients (the cluster's, the admin
// socket's); render*.go the tables, JSON and YAML; progress.go every percentage and bar.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
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
	// MapperDir is where local mode looks for encrypted volumes' dm-crypt mappings; empty:
	// /dev/mapper (tests set it).
	MapperDir string
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
		fmt.Fprint(os.Stderr, usage())
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

// command is one entry of a dispatch table: a command of one mode and its line in help.
type command struct {
	// name selects the command: the first argument (of a subcommand: the second).
	name string
	// synopsis is the command with its arguments and flags, as help lists it.
	synopsis string
	// help says what the command does; help indents its lines after the first.
	help string
	// run carries out the command with the arguments after its name.
	run func(ctx context.Context, o *Options, args []string, out io.Writer) error
	// sub are a group's subcommands (disk fail, disk add, ...), listed by help in its place.
	sub []command
}

// clusterCommands are cluster mode's commands, in the order help lists them.
var clusterCommands = []command{
	{name: "status", synopsis: "status", run: clusterStatusCmd,
		help: "nodes (disks healthy/total, usable, free) and volumes,\nfailed, degraded and rebuilding ones first"},
	{name: "volumes", synopsis: "volumes [NAME]", run: clusterVolumesCmd,
		help: "volumes, as kubectl get r10v, with rebuild progress bars"},
	{name: "disks", synopsis: "disks [NODE]", run: clusterDisksCmd,
		help: "every node's disks: state, size, free"},
	{name: "snapshots", synopsis: "snapshots [VOLUME]", run: clusterSnapshotsCmd,
		help: "snapshots (of VOLUME), as kubectl get r10s, with copy progress"},
	{name: "describe", synopsis: "describe volume NAME", run: describeCmd,
		help: "spec, status, source and copy, members, snapshots,\nconditions and recent Events"},
	{name: "replace-disk", synopsis: "replace-disk NODE OLD NEW [--wipe] [--follow] [--timeout 2m]", run: replaceDiskCmd,
		help: "ask NODE's agent to replace its Failed or Missing disk OLD\n" +
			"(an id or path from \"disks\") by the blank disk at path NEW;\n" +
			"the volumes on OLD rebuild onto NEW (--follow: print their\n" +
			"progress until Healthy)"},
	{name: "scrub", synopsis: clusterScrubUsage, run: clusterScrubCmd,
		help: "ask the volume's node agent for a check (compare the two\n" +
			"copies, count mismatches) or repair: sets spec.scrub, the\n" +
			"agent answers in status.scrub (--follow: progress to the end)"},
}

// localCommands are local mode's commands, in the order help lists them. Those that cluster
// mode lacks act on one node's pool only.
var localCommands = []command{
	{name: "status", synopsis: "status", run: localStatusCmd, help: "pool capacity, disks and volumes"},
	{name: "disks", synopsis: "disks", run: localDisksCmd, help: "list disks"},
	{name: "volumes", synopsis: "volumes [NAME]", run: localVolumesCmd, help: "list volumes (or one)"},
	{name: "snapshots", synopsis: "snapshots [VOLUME]", run: localSnapshotsCmd, help: "list snapshots (of VOLUME) with copy progress"},
	{name: "create", synopsis: "create NAME SIZE [--members N]", run: createCmd,
		help: "create a volume (SIZE like 10Gi, 512Mi, 1G, bytes)"},
	{name: "delete", synopsis: "delete NAME", run: deleteCmd, help: "delete a volume"},
	{name: "expand", synopsis: "expand NAME SIZE", run: expandCmd, help: "grow a volume in place"},
	{name: "disk", sub: []command{
		{name: "fail", synopsis: "disk fail DISK", run: diskFailCmd,
			help: "mark a disk failed (DISK: UUID, its first 8 digits, path or serial/WWN)"},
		{name: "replace", synopsis: "disk replace DISK NEWPATH [--wipe]", run: diskReplaceCmd,
			help: "replace a failed or missing disk; its volumes rebuild onto NEWPATH"},
		{name: "add", synopsis: "disk add PATH [--spare] [--wipe]", run: diskAddCmd,
			help: "add a disk (or bring back a missing one)"},
		{name: "readd", synopsis: "disk readd DISK", run: diskReaddCmd,
			help: "put a failed disk that works again back (bitmap resync)"},
	}},
	{name: "scrub", synopsis: localScrubUsage, run: localScrubCmd,
		help: "check (compare the copies, count mismatches) or repair a\n" +
			"volume in the background; --follow prints progress to the end"},
	{name: "wait", synopsis: waitUsage, run: waitCmd, help: "wait for a volume's health, printing rebuild progress"},
	{name: "serve", synopsis: "serve", run: serveCmd, help: "run the standalone node agent (local mode only)"},
}

// usageModes is help's text above the command lists.
const usageModes = `usage: kubectl raid10 [flags] <command> [args]

Modes:
  (default)      cluster mode, through the Raid10Volume/Raid10Node resources, with the
                 kubeconfig kubectl uses (--kubeconfig, $KUBECONFIG, ~/.kube/config)
  --local        this node's pool directly: through the admin socket of the process that
                 holds it (the standalone agent's in --run-dir, the plugin's in --state-dir),
                 or by opening the pool from --pool-config when nothing runs
                 (also written as a leading "local" command: kubectl raid10 local status)
`

// usage is the help text above the flags: the modes, then each mode's commands.
func usage() string {
	var b strings.Builder
	b.WriteString(usageModes)
	b.WriteString("\nCluster commands (-o table|json|yaml):\n")
	listCommands(&b, clusterCommands)
	b.WriteString("\nLocal commands (--local):\n")
	listCommands(&b, localCommands)
	b.WriteString("\nFlags:\n")
	return b.String()
}

// synopsisWidth is the width of help's command column; a longer synopsis has its own line.
const synopsisWidth = 30

// listCommands writes a line per command: the synopsis, then the help beside it.
func listCommands(b *strings.Builder, cmds []command) {
	indent := strings.Repeat(" ", 2+synopsisWidth+1)
	for _, c := range cmds {
		if c.sub != nil {
			listCommands(b, c.sub)
			continue
		}
		help := strings.ReplaceAll(c.help, "\n", "\n"+indent)
		if len(c.synopsis) > synopsisWidth {
			fmt.Fprintf(b, "  %s\n%s%s\n", c.synopsis, indent, help)
		} else {
			fmt.Fprintf(b, "  %-*s %s\n", synopsisWidth, c.synopsis, help)
		}
	}
}

// findCommand returns the command of cmds called name, or nil.
func findCommand(cmds []command, name string) *command {
	i := slices.IndexFunc(cmds, func(c command) bool { return c.name == name })
	if i < 0 {
		return nil
	}
	return &cmds[i]
}

// run executes one command (args[0], args[1] for a group's subcommand) of the mode that o
// selects.
func run(ctx context.Context, o *Options, args []string, out io.Writer) error {
	cmds := localCommands
	if !o.Local {
		cmds = clusterCommands
	}
	c := findCommand(cmds, args[0])
	switch {
	case c == nil && !o.Local && findCommand(localCommands, args[0]) != nil:
		return fmt.Errorf("%q works on one node's pool: run it there with --local (in a cluster, volumes come from PersistentVolumeClaims; disks change with replace-disk)", args[0])
	case c == nil:
		return fmt.Errorf("unknown command %q (see kubectl-raid10 help)", args[0])
	case c.sub == nil:
		return c.run(ctx, o, args[1:], out)
	case len(args) < 2:
		var names []string
		for _, s := range c.sub {
			names = append(names, s.name)
		}
		return fmt.Errorf("usage: %s %s ... (see kubectl-raid10 help)", c.name, strings.Join(names, "|"))
	}
	s := findCommand(c.sub, args[1])
	if s == nil {
		return fmt.Errorf("unknown command %q", c.name+" "+args[1])
	}
	return s.run(ctx, o, args[2:], out)
}

// localFlags is a local command's flag set, with -o, which may also follow the command.
func localFlags(o *Options, name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&o.Output, "o", o.Output, "output format: table, json or yaml")
	return fs
}

// clusterFlags is a cluster command's flag set: -o, --kubeconfig and --context, which may
// also follow the command, where kubectl users put them.
func clusterFlags(o *Options, name string) *flag.FlagSet {
	fs := localFlags(o, name)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file")
	fs.StringVar(&o.Context, "context", o.Context, "kubeconfig context")
	return fs
}

// parseArgs parses flags anywhere among the positional arguments and checks their count;
// what is the command's usage, for the errors.
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
