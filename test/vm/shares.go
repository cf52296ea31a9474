package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// QEMU's -virtfs splits on commas; the init script does not quote for spaces.
var (
	safePath = regexp.MustCompile(`^/[A-Za-z0-9._/+=@-]*$`)
	envName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// guestPrivate are the paths the guest mounts fresh; host files there are hidden.
var guestPrivate = []string{"/tmp", "/run", "/var/tmp", "/dev"}

func hiddenInGuest(p string) bool {
	for _, g := range guestPrivate {
		if p == g || strings.HasPrefix(p, g+"/") {
			return true
		}
	}
	return false
}

// writableShares are the extra read-write 9p shares: Options.Writable, plus Dir
// when the guest would not see it otherwise.
func (o Options) writableShares() []string {
	out := append([]string(nil), o.Writable...)
	if hiddenInGuest(o.Dir) {
		covered := false
		for _, w := range out {
			if o.Dir == w || strings.HasPrefix(o.Dir, w+"/") {
				covered = true
			}
		}
		if !covered {
			out = append(out, o.Dir)
		}
	}
	// Parents first, so a nested share is mounted on top of its parent.
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) < len(out[j]) })
	return out
}

// writeRunFiles writes config.sh, env.sh and script.sh into the run directory; k is the
// kernel booted.
func writeRunFiles(runDir string, o Options, k Kernel, script string) error {
	var c strings.Builder
	fmt.Fprintf(&c, "RUN_DIR=%s\nWORK_DIR=%s\n", shQuote(runDir), shQuote(o.Dir))
	if o.NoExitSync {
		c.WriteString("NO_EXIT_SYNC=1\n")
	}
	if wd := o.watchdog(); wd > 0 {
		fmt.Fprintf(&c, "CMD_TIMEOUT=%d\n", int(wd.Seconds()))
	}
	c.WriteString("vm_setup() {\n\tvm_mount_std\n")
	fmt.Fprintf(&c, "\tvm_bind_run %s\n", shQuote(runDir))
	for i, w := range o.writableShares() {
		fmt.Fprintf(&c, "\tvm_share rw%d %s\n", i+1, shQuote(w))
	}
	if k.Root != "" {
		fmt.Fprintf(&c, "\tvm_kernel_modules %s %s\n", shQuote(k.ModulesDir), shQuote(k.Version))
	}
	if len(o.Modules) > 0 {
		c.WriteString("\tlog \"modprobe " + strings.Join(o.Modules, " ") + "\"\n")
	}
	// One modprobe -a for the modules without parameters: every exec of a host
	// binary costs reads over 9p under TCG.
	var plain []string
	for _, m := range o.Modules {
		if o.ModuleParams[m] == "" {
			plain = append(plain, shQuote(m))
			continue
		}
		fmt.Fprintf(&c, "\tvm_modprobe %s", shQuote(m))
		for _, p := range strings.Fields(o.ModuleParams[m]) {
			fmt.Fprintf(&c, " %s", shQuote(p))
		}
		c.WriteString("\n")
	}
	if len(plain) > 0 {
		fmt.Fprintf(&c, "\tvm_modprobe -a %s\n", strings.Join(plain, " "))
	}
	c.WriteString("\tvm_mount_configfs\n}\n")

	var e strings.Builder
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=/tmp",
		"TMPDIR=/tmp",
		InGuestEnv + "=1",
		RunDirEnv + "=" + runDir,
	}
	if os.Getenv("PATH") == "" {
		env[0] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, kv := range append(env, o.Env...) {
		k, v, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&e, "export %s=%s\n", k, shQuote(v))
	}
	files := map[string]string{
		"config.sh": c.String(),
		"env.sh":    e.String(),
		"script.sh": script + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(runDir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// shQuote quotes s for sh.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// ShellJoin quotes each argument for sh and joins them: a script that runs argv.
func ShellJoin(argv ...string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = shQuote(a)
	}
	return strings.Join(q, " ")
}
