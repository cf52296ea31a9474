package ublk

import (
	"testing"
	"unsafe"
)

// The ioctl encodings and struct layouts against the values of the kernel's uapi header
// (include/uapi/linux/ublk_cmd.h, 6.12).
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
		{"UBLK_U_IO_FETCH_REQ", ioFetchReq, 0xc0107520},
		{"UBLK_U_IO_COMMIT_AND_FETCH_REQ", ioCommitAndFetchReq, 0xc0107521},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
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
