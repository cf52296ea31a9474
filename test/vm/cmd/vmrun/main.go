// Command vmrun runs a shell command in the raid10-csi test VM (package test/vm):
// the host's distribution kernel under QEMU TCG, with nbd, md raid10, brd and
// null_blk loaded and the host root visible read-only. It exits with the
// command's exit status (125 when the VM itself failed).
//
//	go run ./test/vm/cmd/vmrun -- 'cat /proc/mdstat; ls /dev/nbd0'
//	go run ./test/vm/cmd/vmrun -env FOO=bar -mem 3072 -- ./my.test -test.v
//	go run ./test/vm/cmd/vmrun -gotest ./pkg/nbd -- -test.run=TestKernel -test.v
//	go run ./test/vm/cmd/vmrun -kernel 7.3 -modules nbd,ublk_drv -- 'uname -r; ls /dev/ublk-control'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/test/vm"
)

type envFlag []string

func (e *envFlag) String() string     { return strings.Join(*e, ",") }
func (e *envFlag) Set(s string) error { *e = append(*e, s); return nil }

func main() { os.Exit(run()) }

// run returns the exit status: the guest command's, 125 when the VM failed, 2
// for bad usage. (A function, so that its defers run before os.Exit.)
func run() int {
	var (
		opts     vm.Options
		env      envFlag
		writable envFlag
		params   envFlag
		modules  string
		console  bool
		gotest   string
	)
	flag.StringVar(&opts.KernelSeries, "kernel", "", "kernel series to boot, e.g. "+vm.NewestKernelSeries+" (default: "+vm.DefaultKernelSeries+")")
	flag.IntVar(&opts.Memory, "mem", 2048, "guest memory in MiB")
	flag.IntVar(&opts.CPUs, "cpus", 2, "guest virtual CPUs")
	flag.DurationVar(&opts.Timeout, "timeout", 10*time.Minute, "kill the guest after this long")
	flag.StringVar(&opts.Dir, "dir", "", "working directory in the guest (default: current directory)")
	flag.Var(&env, "env", "KEY=value for the guest command (repeatable)")
	flag.Var(&writable, "writable", "host directory shared read-write at the same path (repeatable)")
	flag.Var(&params, "param", "module parameters, e.g. 'brd=rd_nr=4 rd_size=65536' (repeatable)")
	flag.StringVar(&modules, "modules", strings.Join(vm.DefaultModules, ","), "modules to load before the command (comma-separated)")
	flag.BoolVar(&console, "console", false, "stream the serial console to stderr")
	flag.BoolVar(&opts.KeepRunDir, "keep", false, "keep the run directory (script, output, console.log)")
	flag.DurationVar(&opts.Watchdog, "watchdog", 0, "SIGQUIT+SIGKILL the command in the guest after this long (default: timeout less 1m; negative: never)")
	flag.StringVar(&gotest, "gotest", "", "build this package's test binary (go test -c) and run it with the arguments, in its directory")
	var buildFlags string
	flag.StringVar(&buildFlags, "buildflags", "", "with -gotest: flags for go test -c, space-separated (e.g. -race)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: vmrun [flags] -- command [args...]\n"+
			"A single argument is run as a shell script; several are quoted and run as argv.\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var script string
	switch {
	case gotest != "":
		bin, dir, cleanup, err := vm.BuildGoTest(ctx, gotest, strings.Fields(buildFlags)...)
		if err != nil {
			klog.ErrorS(err, "build test binary", "package", gotest)
			klog.Flush()
			return 125
		}
		defer cleanup()
		if opts.Dir == "" {
			opts.Dir = dir
		}
		script = "exec " + vm.ShellJoin(append([]string{bin}, flag.Args()...)...)
	case flag.NArg() == 0:
		flag.Usage()
		return 2
	case flag.NArg() == 1:
		script = flag.Arg(0)
	default:
		script = "exec " + vm.ShellJoin(flag.Args()...)
	}
	opts.Env = env
	opts.Writable = writable
	opts.Modules = nil
	if modules != "" {
		opts.Modules = strings.Split(modules, ",")
	} else {
		opts.Modules = []string{}
	}
	opts.ModuleParams = map[string]string{}
	for _, p := range params {
		m, v, ok := strings.Cut(p, "=")
		if !ok {
			klog.ErrorS(nil, "bad -param, want module=params", "param", p)
			klog.Flush()
			return 2
		}
		opts.ModuleParams[m] = v
	}
	opts.Stdout = os.Stdout
	if console {
		opts.Console = os.Stderr
	}

	res, err := vm.Run(ctx, opts, script)
	if err != nil {
		if res != nil && !console && !errors.Is(err, vm.ErrTimeout) && !errors.Is(err, vm.ErrNoExitStatus) {
			fmt.Fprint(os.Stderr, res.ConsoleTail(40))
		}
		klog.ErrorS(err, "vm run failed")
		klog.Flush()
		return 125
	}
	fmt.Fprintf(os.Stderr, "vmrun: kernel %s, exit status %d, boot %s, total %s\n", res.Kernel.Version, res.ExitCode,
		res.Boot.Round(time.Millisecond), res.Duration.Round(time.Millisecond))
	return res.ExitCode
}
