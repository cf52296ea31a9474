package ublk

import (
	"testing"
	"unsafe"
)

// The ioctl encodings, flags and struct layouts against the values of the kernel's uapi
// header (include/uapi/linux/ublk_cmd.h: 6.12; UPDATE_SIZE and the newer flags as in 7.3).
func TestABI(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uint32
	}{
		{"UBLK_U_CMD_GET_DEV_INFO", ctrlOp[cmdGetDevInfo], 0x80207502},
		{"UBLK_U_CMD_ADD_DEV", ctrlOp[cmdAddDev], 0xc0207504},
		{"UBLK_U_CMD_DEL_DEV", ctrlOp[cmdDelDev], 0xc0207505},
		{"UBLK_U_CMD_START_DEV", ctrlOp[cmdStartDev], 0xc0207506},
		{"UBLK_U_CMD_STOP_DEV", ctrlOp[cmdStopDev], 0xc0207507},
		{"UBLK_U_CMD_SET_PARAMS", ctrlOp[cmdSetParams], 0xc0207508},
		{"UBLK_U_CMD_START_USER_RECOVERY", ctrlOp[cmdStartUserRecovery], 0xc0207510},
		{"UBLK_U_CMD_END_USER_RECOVERY", ctrlOp[cmdEndUserRecovery], 0xc0207511},
		{"UBLK_U_CMD_GET_FEATURES", ctrlOp[cmdGetFeatures], 0x80207513},
		{"UBLK_U_CMD_UPDATE_SIZE", ctrlOp[cmdUpdateSize], 0xc0207515},
		{"UBLK_U_IO_FETCH_REQ", ioFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioCommitAndFetchReq, 0xc0107521},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	for _, c := range []struct {
		name      string
		got, want Flags
	}{
		{"UBLK_F_SUPPORT_ZERO_COPY", FlagSupportZeroCopy, 0x1},
		{"UBLK_F_URING_CMD_COMP_IN_TASK", FlagURingCmdCompInTask, 0x2},
		{"UBLK_F_USER_RECOVERY", FlagUserRecovery, 0x8},
		{"UBLK_F_USER_RECOVERY_REISSUE", FlagUserRecoveryReissue, 0x10},
		{"UBLK_F_CMD_IOCTL_ENCODE", FlagCmdIoctlEncode, 0x40},
		{"UBLK_F_UPDATE_SIZE", FlagUpdateSize, 0x400},
		{"UBLK_F_AUTO_BUF_REG", FlagAutoBufReg, 0x800},
		{"UBLK_F_PER_IO_DAEMON", FlagPerIODaemon, 0x2000},
		{"UBLK_F_BATCH_IO", FlagBatchIO, 0x8000},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, uint64(c.got), uint64(c.want))
		}
	}
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(ublksrv_ctrl_cmd)", unsafe.Sizeof(ctrlCmd{}), 32},
		{"ublksrv_ctrl_cmd.data", unsafe.Offsetof(ctrlCmd{}.data), 16},
		{"sizeof(ublksrv_ctrl_dev_info)", unsafe.Sizeof(DevInfo{}), 64},
		{"ublksrv_ctrl_dev_info.flags", unsafe.Offsetof(DevInfo{}.Flags), 24},
		{"ublksrv_ctrl_dev_info.ublksrv_flags", unsafe.Offsetof(DevInfo{}.ServerFlags), 32},
		{"sizeof(ublksrv_io_desc)", unsafe.Sizeof(ioDesc{}), 24},
		{"sizeof(ublksrv_io_cmd)", unsafe.Sizeof(ioCmd{}), 16},
		{"ublk_params.basic.dev_sectors", unsafe.Offsetof(params{}.devSectors), 8 + 16},
		{"ublk_params.discard", unsafe.Offsetof(params{}.discardAlignment), 8 + 32},
		{"ublk_params.discard.max_discard_segments", unsafe.Offsetof(params{}.maxDiscardSegments), 8 + 32 + 16},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if got := descArea(1); got != 4096*24 {
		t.Errorf("queue 1's descriptors at %d, want %d", got, 4096*24)
	}
}

func TestOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		o    Options
		ok   bool
	}{
		{"defaults", Options{}, true},
		{"depth too big", Options{Depth: 5000}, false},
		{"max io not a page multiple", Options{MaxIO: 6000}, false},
		{"max io too big", Options{MaxIO: 64 << 20}, false},
		{"too many queues", Options{Queues: 65}, false},
		{"block size 1024", Options{BlockSize: 1024}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := c.o.withDefaults()
			if (err == nil) != c.ok {
				t.Fatalf("withDefaults(%+v): %v", c.o, err)
			}
			if c.ok && (o.Queues < 1 || o.Queues > MaxQueues || o.Depth != DefaultDepth || o.MaxIO != DefaultMaxIO) {
				t.Errorf("defaults %+v", o)
			}
		})
	}
}

// TestFlags: the names of the kernel's features, what the status reports, and what a
// kernel lacks of Required (Debian's 6.12 lacks only UPDATE_SIZE, its 7.3 nothing).
func TestFlags(t *testing.T) {
	// What GET_FEATURES returned in the VM (TestInGuestAttach's log).
	const k612, k73 Flags = 0x1fe, 0x1fffff
	for _, c := range []struct {
		name        string
		f           Flags
		str, report string
		missing     Flags
	}{
		{"none", 0, "0", "", Required},
		{"6.12", k612, "URING_CMD_COMP_IN_TASK|NEED_GET_DATA|USER_RECOVERY|USER_RECOVERY_REISSUE|UNPRIVILEGED_DEV|CMD_IOCTL_ENCODE|USER_COPY|ZONED",
			"", FlagUpdateSize},
		{"7.3", k73, "SUPPORT_ZERO_COPY|URING_CMD_COMP_IN_TASK|NEED_GET_DATA|USER_RECOVERY|USER_RECOVERY_REISSUE|UNPRIVILEGED_DEV|CMD_IOCTL_ENCODE|USER_COPY|ZONED|USER_RECOVERY_FAIL_IO|UPDATE_SIZE|AUTO_BUF_REG|QUIESCE|PER_IO_DAEMON|BUF_REG_OFF_DAEMON|BATCH_IO|INTEGRITY|SAFE_STOP_DEV|NO_AUTO_PART_SCAN|0x180000",
			"SUPPORT_ZERO_COPY, UPDATE_SIZE, AUTO_BUF_REG, PER_IO_DAEMON, BATCH_IO", 0},
		{"unknown bits", FlagUpdateSize | 1<<40, "UPDATE_SIZE|0x10000000000", "UPDATE_SIZE", FlagCmdIoctlEncode | FlagUserRecovery | FlagUserRecoveryReissue},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.str != "" && c.f.String() != c.str {
				t.Errorf("String() = %q, want %q", c.f.String(), c.str)
			}
			if got := c.f.Report(); got != c.report {
				t.Errorf("Report() = %q, want %q", got, c.report)
			}
			if got := c.f.Missing(Required); got != c.missing {
				t.Errorf("Missing(Required) = %s, want %s", got, c.missing)
			}
			if c.f.Has(Required) != (c.missing == 0) {
				t.Errorf("Has(Required) = %v with %s missing", c.f.Has(Required), c.missing)
			}
		})
	}
}
