package vm_test

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/raid10-csi/raid10-csi/test/vm"
)

// smokeScript runs in the guest. Each step prints "STEP <name> <uptime>" so the
// host can log the time it took; `set -e` makes any failing step the exit status.
const smokeScript = `set -eu
step() { echo "STEP $1 $(cut -d' ' -f1 /proc/uptime)"; }
step start

# --- kernel NBD client against nbdkit's memory plugin over a unix socket ---
SOCK=/tmp/nbdkit.sock
nbdkit --unix "$SOCK" --pidfile /tmp/nbdkit.pid memory size=64M
step nbdkit-started
nbd-client -N smoke -u "$SOCK" /dev/nbd0 -b 4096
test "$(cat /sys/block/nbd0/size)" = 131072
step nbd-attached
mkfs.ext4 -q -F /dev/nbd0
step mkfs.ext4
mkdir -p /tmp/mnt
mount /dev/nbd0 /tmp/mnt
echo "$SMOKE_TOKEN" > /tmp/mnt/hello
sync
umount /tmp/mnt
step mount-write-umount
nbd-client -d /dev/nbd0
test "$(cat /sys/block/nbd0/size)" = 0
step nbd-detached
# Read back through a fresh connection: the data went to the server, not a cache.
nbd-client -N smoke -u "$SOCK" /dev/nbd0 -b 4096
mount -o ro /dev/nbd0 /tmp/mnt
echo "readback: $(cat /tmp/mnt/hello)"
test "$(cat /tmp/mnt/hello)" = "$SMOKE_TOKEN"
umount /tmp/mnt
nbd-client -d /dev/nbd0
kill "$(cat /tmp/nbdkit.pid)"
step nbd-readback

# --- md raid10 over 4 brd ramdisks (brd loaded with rd_nr=4 by the host) ---
test -b /dev/ram3
mdadm --create /dev/md0 --level=10 --raid-devices=4 --run --assume-clean --quiet \
	/dev/ram0 /dev/ram1 /dev/ram2 /dev/ram3
grep -A1 '^md0' /proc/mdstat
step md-create
head -c 8388608 /dev/urandom > /tmp/data
want=$(sha256sum < /tmp/data)
dd if=/tmp/data of=/dev/md0 bs=1M oflag=direct status=none
got=$(dd if=/dev/md0 bs=1M count=8 iflag=direct status=none | sha256sum)
test "$got" = "$want"
step md-write-read
# Fail one leg: reads must still return the same data from its mirror.
mdadm /dev/md0 --fail /dev/ram0 --quiet
grep -q '\[4/3\]' /proc/mdstat
got=$(dd if=/dev/md0 bs=1M count=8 iflag=direct status=none | sha256sum)
test "$got" = "$want"
step md-degraded-read
mdadm --stop /dev/md0 --quiet
step md-stop
echo SMOKE-OK
`

// TestSmokeNBDAndRAID10 boots the VM once and checks the kernel pieces the
// driver relies on: the NBD client (attach, mkfs, mount, write, detach, read back)
// and md raid10 (create, write/read, degraded read).
func TestSmokeNBDAndRAID10(t *testing.T) {
	vm.Require(t)
	token := fmt.Sprintf("raid10-csi-smoke-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := vm.Run(ctx, vm.Options{
		Timeout:      4 * time.Minute,
		Env:          []string{"SMOKE_TOKEN=" + token},
		Modules:      []string{"nbd", "raid10", "brd", "ext4"},
		ModuleParams: map[string]string{"brd": "rd_nr=4 rd_size=32768"},
	}, smokeScript)
	if err != nil {
		t.Fatalf("vm.Run: %v", err)
	}
	t.Logf("boot %s, boot+run+poweroff %s (kernel %s)", res.Boot.Round(time.Millisecond), res.Duration.Round(time.Millisecond), res.Kernel.Version)
	logSteps(t, res)
	if res.ExitCode != 0 {
		t.Fatalf("smoke script exited %d; output:\n%s\nconsole tail:\n%s", res.ExitCode, res.Output, res.ConsoleTail(30))
	}
	if !strings.Contains(res.Output, "readback: "+token) || !strings.Contains(res.Output, "SMOKE-OK") {
		t.Fatalf("smoke output lacks the read-back token or SMOKE-OK:\n%s", res.Output)
	}
}

// logSteps logs the guest time between consecutive "STEP name uptime" lines, and
// the guest's boot time (the init log's "ready" line).
func logSteps(t *testing.T, res *vm.Result) {
	t.Helper()
	for _, l := range strings.Split(res.ConsoleLog, "\n") {
		if strings.HasPrefix(l, "raid10-vm: [") {
			t.Logf("console: %s", l)
		}
	}
	prev := -1.0
	sc := bufio.NewScanner(strings.NewReader(res.Output))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "STEP" {
			continue
		}
		up, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			continue
		}
		if prev >= 0 {
			t.Logf("step %-20s %6.2fs (guest time)", f[1], up-prev)
		} else {
			t.Logf("step %-20s at guest uptime %.2fs", f[1], up)
		}
		prev = up
	}
}
