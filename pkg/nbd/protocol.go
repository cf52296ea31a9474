package nbd

import "github.com/pojntfx/go-nbd/pkg/protocol"

// Wire constants of the NBD protocol (doc/proto.md of the NetworkBlockDevice project). The
// ones go-nbd's protocol package defines are taken from it; the rest are added here.

// Handshake magics.
const (
	magicNBD         uint64 = protocol.NEGOTIATION_MAGIC_OLDSTYLE // "NBDMAGIC"
	magicOption      uint64 = protocol.NEGOTIATION_MAGIC_OPTION   // "IHAVEOPT"
	magicOptionReply uint64 = protocol.NEGOTIATION_MAGIC_REPLY
	magicRequest     uint32 = protocol.TRANSMISSION_MAGIC_REQUEST
	magicReply       uint32 = protocol.TRANSMISSION_MAGIC_REPLY
)

// HandshakeFlags are the server's handshake flags; the client echoes the ones it uses.
type HandshakeFlags uint16

// Handshake flags.
const (
	FlagFixedNewstyle HandshakeFlags = HandshakeFlags(protocol.NEGOTIATION_HANDSHAKE_FLAG_FIXED_NEWSTYLE)
	FlagNoZeroes      HandshakeFlags = 1 << 1
)

// OptionID identifies a negotiation option.
type OptionID uint32

// Options of the negotiation phase.
const (
	OptExportName      OptionID = 1
	OptAbort           OptionID = OptionID(protocol.NEGOTIATION_ID_OPTION_ABORT)
	OptList            OptionID = OptionID(protocol.NEGOTIATION_ID_OPTION_LIST)
	OptStartTLS        OptionID = 5
	OptInfo            OptionID = OptionID(protocol.NEGOTIATION_ID_OPTION_INFO)
	OptGo              OptionID = OptionID(protocol.NEGOTIATION_ID_OPTION_GO)
	OptStructuredReply OptionID = 8
	OptListMetaContext OptionID = 9
	OptSetMetaContext  OptionID = 10
	OptExtendedHeaders OptionID = 11
)

// ReplyType is the type of an option reply. Error types have bit 31 set.
type ReplyType uint32

// Option reply types.
const (
	RepAck             ReplyType = ReplyType(protocol.NEGOTIATION_TYPE_REPLY_ACK)
	RepServer          ReplyType = ReplyType(protocol.NEGOTIATION_TYPE_REPLY_SERVER)
	RepInfo            ReplyType = ReplyType(protocol.NEGOTIATION_TYPE_REPLY_INFO)
	RepErrUnsup        ReplyType = ReplyType(protocol.NEGOTIATION_TYPE_REPLY_ERR_UNSUPPORTED)
	RepErrPolicy       ReplyType = 2 | 1<<31
	RepErrInvalid      ReplyType = 3 | 1<<31
	RepErrPlatform     ReplyType = 4 | 1<<31
	RepErrTLSReqd      ReplyType = 5 | 1<<31
	RepErrUnknown      ReplyType = ReplyType(protocol.NEGOTIATION_TYPE_REPLY_ERR_UNKNOWN)
	RepErrShutdown     ReplyType = 7 | 1<<31
	RepErrBlockSizeReq ReplyType = 8 | 1<<31
	RepErrTooBig       ReplyType = 9 | 1<<31
)

// InfoType is the type of an NBD_REP_INFO payload.
type InfoType uint16

// Information types of NBD_REP_INFO.
const (
	InfoExport      InfoType = InfoType(protocol.NEGOTIATION_TYPE_INFO_EXPORT)
	InfoName        InfoType = InfoType(protocol.NEGOTIATION_TYPE_INFO_NAME)
	InfoDescription InfoType = InfoType(protocol.NEGOTIATION_TYPE_INFO_DESCRIPTION)
	InfoBlockSize   InfoType = InfoType(protocol.NEGOTIATION_TYPE_INFO_BLOCKSIZE)
)

// TransmissionFlags describe an export to the client (and to the kernel: they are passed as
// NBD_ATTR_SERVER_FLAGS).
type TransmissionFlags uint16

// Transmission flags.
const (
	FlagHasFlags        TransmissionFlags = TransmissionFlags(protocol.NEGOTIATION_REPLY_FLAGS_HAS_FLAGS)
	FlagReadOnly        TransmissionFlags = 1 << 1
	FlagSendFlush       TransmissionFlags = 1 << 2
	FlagSendFUA         TransmissionFlags = 1 << 3
	FlagRotational      TransmissionFlags = 1 << 4
	FlagSendTrim        TransmissionFlags = 1 << 5
	FlagSendWriteZeroes TransmissionFlags = 1 << 6
	FlagSendDF          TransmissionFlags = 1 << 7
	FlagCanMultiConn    TransmissionFlags = TransmissionFlags(protocol.NEGOTIATION_REPLY_FLAGS_CAN_MULTI_CONN)
	FlagSendResize      TransmissionFlags = 1 << 9
	FlagSendCache       TransmissionFlags = 1 << 10
	FlagSendFastZero    TransmissionFlags = 1 << 11
)

// Command is a transmission request type.
type Command uint16

// Transmission commands.
const (
	CmdRead        Command = Command(protocol.TRANSMISSION_TYPE_REQUEST_READ)
	CmdWrite       Command = Command(protocol.TRANSMISSION_TYPE_REQUEST_WRITE)
	CmdDisc        Command = Command(protocol.TRANSMISSION_TYPE_REQUEST_DISC)
	CmdFlush       Command = 3
	CmdTrim        Command = 4
	CmdCache       Command = 5
	CmdWriteZeroes Command = 6
	CmdBlockStatus Command = 7
	CmdResize      Command = 8
)

// CommandFlags modify a transmission request.
type CommandFlags uint16

// Command flags.
const (
	CmdFlagFUA      CommandFlags = 1 << 0
	CmdFlagNoHole   CommandFlags = 1 << 1
	CmdFlagDF       CommandFlags = 1 << 2
	CmdFlagReqOne   CommandFlags = 1 << 3
	CmdFlagFastZero CommandFlags = 1 << 4
)

// Errno is the error field of a reply: a Linux errno value, as the protocol fixes them.
type Errno uint32

// Error codes of replies.
const (
	ErrnoNone     Errno = 0
	ErrnoPerm     Errno = Errno(protocol.TRANSMISSION_ERROR_EPERM)
	ErrnoIO       Errno = 5
	ErrnoNoMem    Errno = 12
	ErrnoInval    Errno = Errno(protocol.TRANSMISSION_ERROR_EINVAL)
	ErrnoNoSpc    Errno = 28
	ErrnoOverflow Errno = 75
	ErrnoNotSup   Errno = 95
	ErrnoShutdown Errno = 108
)

const (
	requestHeaderSize = 28
	replyHeaderSize   = 16
)
