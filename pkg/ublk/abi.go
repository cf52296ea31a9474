package ublk

import "unsafe"

// The kernel ABI of include/uapi/linux/ublk_cmd.h, as far as this package uses it.

// Commands are sent ioctl-encoded (_IOR/_IOWR('u', nr, struct)), the encoding every kernel
// since 6.3 takes and the only one a kernel without CONFIG_BLKDEV_UBLK_LEGACY_OPCODES takes.
const (
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, nr, size uint32) uint32 { return dir<<30 | size<<16 | uint32('u')<<8 | nr }

// Control commands (struct ublksrv_ctrl_cmd, 32 bytes, in the SQE128 command area).
const (
	cmdGetDevInfo        = 0x02
	cmdAddDev            = 0x04
	cmdDelDev            = 0x05
	cmdStartDev          = 0x06
	cmdStopDev           = 0x07
	cmdSetParams         = 0x08
	cmdStartUserRecovery = 0x10
	cmdEndUserRecovery   = 0x11
	cmdGetFeatures       = 0x13
	cmdUpdateSize        = 0x15
)

var ctrlOp = map[uint32]uint32{
	cmdGetDevInfo:        ioc(iocRead, cmdGetDevInfo, ctrlCmdSize),
	cmdAddDev:            ioc(iocRead|iocWrite, cmdAddDev, ctrlCmdSize),
	cmdDelDev:            ioc(iocRead|iocWrite, cmdDelDev, ctrlCmdSize),
	cmdStartDev:          ioc(iocRead|iocWrite, cmdStartDev, ctrlCmdSize),
	cmdStopDev:           ioc(iocRead|iocWrite, cmdStopDev, ctrlCmdSize),
	cmdSetParams:         ioc(iocRead|iocWrite, cmdSetParams, ctrlCmdSize),
	cmdStartUserRecovery: ioc(iocRead|iocWrite, cmdStartUserRecovery, ctrlCmdSize),
	cmdEndUserRecovery:   ioc(iocRead|iocWrite, cmdEndUserRecovery, ctrlCmdSize),
	cmdGetFeatures:       ioc(iocRead, cmdGetFeatures, ctrlCmdSize),
	cmdUpdateSize:        ioc(iocRead|iocWrite, cmdUpdateSize, ctrlCmdSize),
}

var ctrlName = map[uint32]string{
	cmdGetDevInfo: "GET_DEV_INFO", cmdAddDev: "ADD_DEV", cmdDelDev: "DEL_DEV",
	cmdStartDev: "START_DEV", cmdStopDev: "STOP_DEV", cmdSetParams: "SET_PARAMS",
	cmdStartUserRecovery: "START_USER_RECOVERY", cmdEndUserRecovery: "END_USER_RECOVERY",
	cmdGetFeatures: "GET_FEATURES", cmdUpdateSize: "UPDATE_SIZE",
}

// I/O commands (struct ublksrv_io_cmd, 16 bytes) on /dev/ublkcN.
var (
	ioFetchReq          = ioc(iocRead|iocWrite, 0x20, ioCmdSize)
	ioCommitAndFetchReq = ioc(iocRead|iocWrite, 0x21, ioCmdSize)
)

// Results of a FETCH_REQ or COMMIT_AND_FETCH_REQ completion.
const (
	ioResOK = 0
	// ioResAbort (-ENODEV): the queue is going away; the tag is not fetched again.
	ioResAbort = -19
)

// Device flags (ublksrv_ctrl_dev_info.flags, UBLK_F_*), which GET_FEATURES also reports as
// the kernel's features. Each is the kernel's bit of that name.
const (
	// FlagSupportZeroCopy: a request's pages can be registered as an io_uring buffer
	// (UBLK_U_IO_REGISTER_IO_BUF) and used by the member I/O without a copy (6.15).
	FlagSupportZeroCopy     Flags = 1 << 0
	FlagURingCmdCompInTask  Flags = 1 << 1
	FlagUserRecovery        Flags = 1 << 3
	FlagUserRecoveryReissue Flags = 1 << 4
	FlagCmdIoctlEncode      Flags = 1 << 6
	// FlagUpdateSize: UBLK_U_CMD_UPDATE_SIZE changes a started device's size (6.16).
	FlagUpdateSize Flags = 1 << 10
	// FlagAutoBufReg: the kernel registers each request's buffer in the fetching ring by
	// itself (zero copy without a register command per request).
	FlagAutoBufReg Flags = 1 << 11
	// FlagPerIODaemon: each tag may be served by its own thread, not one per queue.
	FlagPerIODaemon Flags = 1 << 13
	// FlagBatchIO: requests are fetched and committed in batches (UBLK_U_IO_*_IO_CMDS).
	FlagBatchIO Flags = 1 << 15
)

// Flags are UBLK_F_* device flags.
type Flags uint64

// State is a device's state (UBLK_S_DEV_*).
type State uint16

// Device states.
const (
	StateDead     State = 0
	StateLive     State = 1
	StateQuiesced State = 2
)

func (s State) String() string {
	switch s {
	case StateDead:
		return "dead"
	case StateLive:
		return "live"
	case StateQuiesced:
		return "quiesced"
	}
	return "unknown"
}

// I/O operations (ublksrv_io_desc.op_flags bits 0-7) and flags (bits 8-31).
const (
	opRead        = 0
	opWrite       = 1
	opFlush       = 2
	opDiscard     = 3
	opWriteSame   = 4
	opWriteZeroes = 5

	ioFlagFUA = 1 << 13
)

// Parameter types and attributes (struct ublk_params).
const (
	paramTypeBasic   = 1 << 0
	paramTypeDiscard = 1 << 1

	attrVolatileCache = 1 << 2
	attrFUA           = 1 << 3
)

const (
	ctrlCmdSize = 32
	ioCmdSize   = 16
	devInfoSize = 64
	ioDescSize  = 24
	// maxQueueDepth is UBLK_MAX_QUEUE_DEPTH; each queue's descriptor area is mapped at
	// queue * round_up(maxQueueDepth * 24, page) in /dev/ublkcN.
	maxQueueDepth = 4096
)

// ctrlCmd is struct ublksrv_ctrl_cmd.
type ctrlCmd struct {
	devID      uint32
	queueID    uint16
	len        uint16
	addr       uint64
	data       uint64
	devPathLen uint16
	pad        uint16
	reserved   uint32
}

// DevInfo is struct ublksrv_ctrl_dev_info.
type DevInfo struct {
	NrHwQueues    uint16
	QueueDepth    uint16
	State         State
	pad0          uint16
	MaxIOBufBytes uint32
	DevID         uint32
	ServerPID     int32
	pad1          uint32
	Flags         Flags
	ServerFlags   uint64 // for the server's own use; this package stores its magic here
	OwnerUID      uint32
	OwnerGID      uint32
	reserved1     uint64
	reserved2     uint64
}

// ioDesc is struct ublksrv_io_desc, written by the kernel per tag.
type ioDesc struct {
	opFlags     uint32
	nrSectors   uint32
	startSector uint64
	addr        uint64
}

// ioCmd is struct ublksrv_io_cmd.
type ioCmd struct {
	qID    uint16
	tag    uint16
	result int32
	addr   uint64
}

// params is struct ublk_params up to the discard part (the kernel takes a shorter struct
// and zeroes the rest).
type params struct {
	len   uint32
	types uint32
	// struct ublk_param_basic
	attrs            uint32
	logicalBSShift   uint8
	physicalBSShift  uint8
	ioOptShift       uint8
	ioMinShift       uint8
	maxSectors       uint32
	chunkSectors     uint32
	devSectors       uint64
	virtBoundaryMask uint64
	// struct ublk_param_discard
	discardAlignment      uint32
	discardGranularity    uint32
	maxDiscardSectors     uint32
	maxWriteZeroesSectors uint32
	maxDiscardSegments    uint16
	reserved0             uint16
}

// paramsSize is the length sent in params.len: header 8, basic 32, discard 20 (Go pads the
// struct to 64; the kernel reads the devt part that would follow as absent).
const paramsSize = 8 + 32 + 20

func (c *ctrlCmd) bytes() []byte { return unsafe.Slice((*byte)(unsafe.Pointer(c)), ctrlCmdSize) }
func (c *ioCmd) bytes() []byte   { return unsafe.Slice((*byte)(unsafe.Pointer(c)), ioCmdSize) }
