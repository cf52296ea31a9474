package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// hostContainerdConfig runs the host's containerd on the node's state disk: its root (%[1]s)
// is the guest's /var/lib/containerd (containerd.toml) on the mounted disk; its state
// directory (%[2]s) and sockets (%[3]s, %[4]s) are the host's own; the snapshotters are the
// guest's (overlayfs unpacks the layers); no CRI plugin (nothing here runs a container).
const hostContainerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
`

// importOnHost imports the images the state disk's record (images.imported, node.sh's)
// lacks, with the host's containerd, natively: the guest runs the very same containerd
// binary (from the host's root), so what it finds under /var/lib/containerd is what it would
// have written, and node.sh then finds every sum in the record and imports nothing. Under
// TCG the guest's import took minutes (each layer decompressed and unpacked by the emulated
// CPU); here it takes seconds. It needs a loop mount and an overlay mount (containerd's
// snapshotter) on the host, as root; its error says which step failed. It returns how many
// images it imported.
func (r *Rig) importOnHost() (int, error) {
	imported := 0
	err := onStateDisk(r.state, filepath.Join(r.Dir, "host-containerd.log"), func(ctr ctrFunc, varLib string) error {
		rec, err := os.ReadFile(filepath.Join(varLib, "images.imported"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		have := strings.Fields(string(rec))
		for i, img := range r.cfg.Images {
			if slices.Contains(have, r.imageSums[i]) {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			out, err := ctr(ctx, "images", "import", "--snapshotter", "overlayfs", img)
			cancel()
			if err != nil {
				return fmt.Errorf("ctr images import %s: %w: %s", img, err, trimOut(out))
			}
			imported++
		}
		// node.sh's record (a file of its own beside containerd's root).
		return os.WriteFile(filepath.Join(varLib, "images.imported"), []byte(strings.Join(r.imageSums, "\n")+"\n"), 0o644)
	})
	return imported, err
}

// ctrFunc runs ctr against the host's containerd of onStateDisk, namespace k8s.io (the
// kubelet's), and returns its output.
type ctrFunc func(ctx context.Context, args ...string) ([]byte, error)

// onStateDisk mounts the state disk image (the guest's /var/lib) on a loop device, runs the
// host's containerd on it as the guest would (hostContainerdConfig; its log goes to
// logPath) and calls fn with ctr and the mount point; then it stops containerd and
// unmounts.
func onStateDisk(state, logPath string, fn func(ctr ctrFunc, varLib string) error) (err error) {
	tmp, err := os.MkdirTemp("", "rig-ctrd-") // short: the socket's path is at most 107 bytes
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	mnt := filepath.Join(tmp, "var-lib")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop", state, mnt).CombinedOutput(); err != nil {
		return fmt.Errorf("mount the state disk on a loop device: %w: %s", err, trimOut(out))
	}
	defer func() {
		if out, uerr := exec.Command("umount", mnt).CombinedOutput(); uerr != nil && err == nil {
			err = fmt.Errorf("umount the state disk: %w: %s", uerr, trimOut(out))
		}
	}()

	sock := filepath.Join(tmp, "c.sock")
	cfg := filepath.Join(tmp, "containerd.toml")
	conf := fmt.Sprintf(hostContainerdConfig, filepath.Join(mnt, "containerd"), filepath.Join(tmp, "state"), sock, sock+".ttrpc")
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }()
	ctrd := exec.Command("containerd", "--config", cfg)
	ctrd.Stdout, ctrd.Stderr = logf, logf
	if err := ctrd.Start(); err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	exited := make(chan struct{})
	var waitErr error // set before exited closes
	go func() {
		waitErr = ctrd.Wait()
		close(exited)
	}()
	running := true
	stop := func() {
		if !running {
			return
		}
		running = false
		_ = ctrd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited: // its exit status after SIGTERM says nothing of the import
		case <-time.After(30 * time.Second):
			_ = ctrd.Process.Kill()
			<-exited
		}
	}
	defer stop() // before the unmount (deferred last, runs first)
	ctr := func(ctx context.Context, args ...string) ([]byte, error) {
		return exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
	}
	begin := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := ctr(ctx, "version")
		cancel()
		if err == nil {
			break
		}
		if time.Since(begin) > time.Minute {
			return fmt.Errorf("containerd did not answer in a minute (log %s): %w", logPath, err)
		}
		select {
		case <-exited:
			running = false
			return fmt.Errorf("containerd exited (log %s): %w", logPath, waitErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fn(ctr, mnt)
}

// trimOut trims a command's output for an error message.
func trimOut(out []byte) string { return strings.TrimSpace(string(out)) }
