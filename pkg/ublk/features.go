package ublk

import (
	"fmt"
	"math/bits"
	"strings"
)

// Required are the kernel features every volume operation over ublk needs: ioctl-encoded
// commands (all this package sends), user recovery that reissues what a server left
// unfinished (restarts and handovers of the serving process without an I/O error) and
// UPDATE_SIZE (online expansion, Device.Resize). A kernel that lacks any serves a volume over
// ublk only when it is asked for by name; frontend auto takes NBD there.
const Required = FlagCmdIoctlEncode | FlagUserRecovery | FlagUserRecoveryReissue | FlagUpdateSize

// flagNames are the kernel's names (less UBLK_F_) of the flags String knows.
var flagNames = []struct {
	f    Flags
	name string
}{
	{FlagSupportZeroCopy, "SUPPORT_ZERO_COPY"},
	{FlagURingCmdCompInTask, "URING_CMD_COMP_IN_TASK"},
	{1 << 2, "NEED_GET_DATA"},
	{FlagUserRecovery, "USER_RECOVERY"},
	{FlagUserRecoveryReissue, "USER_RECOVERY_REISSUE"},
	{1 << 5, "UNPRIVILEGED_DEV"},
	{FlagCmdIoctlEncode, "CMD_IOCTL_ENCODE"},
	{1 << 7, "USER_COPY"},
	{1 << 8, "ZONED"},
	{1 << 9, "USER_RECOVERY_FAIL_IO"},
	{FlagUpdateSize, "UPDATE_SIZE"},
	{FlagAutoBufReg, "AUTO_BUF_REG"},
	{1 << 12, "QUIESCE"},
	{FlagPerIODaemon, "PER_IO_DAEMON"},
	{1 << 14, "BUF_REG_OFF_DAEMON"},
	{FlagBatchIO, "BATCH_IO"},
	{1 << 16, "INTEGRITY"},
	{1 << 17, "SAFE_STOP_DEV"},
	{1 << 18, "NO_AUTO_PART_SCAN"},
}

// Reported are the features of the newer kernels that the node reports with a volume's
// frontend (Flags.Report): zero copy (SUPPORT_ZERO_COPY, and AUTO_BUF_REG, its automatic
// buffer registration), online resize (UPDATE_SIZE), per-I/O daemons and batched commands.
// Debian's 6.12 has none of them (GET_FEATURES 0x1fe), its 7.3 all. Of these the node uses
// UPDATE_SIZE (Device.Resize); the others are reported for what the data path may use.
const Reported = FlagSupportZeroCopy | FlagUpdateSize | FlagAutoBufReg | FlagPerIODaemon | FlagBatchIO

// Has reports whether every flag of want is set in f.
func (f Flags) Has(want Flags) bool { return f&want == want }

// Missing returns the flags of want that f lacks.
func (f Flags) Missing(want Flags) Flags { return want &^ f }

// String names the flags by the kernel's names less UBLK_F_, joined by "|", with the bits
// this package does not know in hex; "0" for none.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	var names []string
	rest := f
	for _, n := range flagNames {
		if f&n.f != 0 {
			names = append(names, n.name)
			rest &^= n.f
		}
	}
	if rest != 0 {
		names = append(names, fmt.Sprintf("%#x", uint64(rest)))
	}
	return strings.Join(names, "|")
}

// Report names the Reported features f has, in bit order, separated by ", ": what a
// volume's status shows after "ublk". "" when it has none.
func (f Flags) Report() string {
	var names []string
	for r := f & Reported; r != 0; r &= r - 1 {
		names = append(names, Flags(1<<bits.TrailingZeros64(uint64(r))).String())
	}
	return strings.Join(names, ", ")
}
