package kernel

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
)

// Generic netlink names and numbers of the nbd family (include/uapi/linux/nbd-netlink.h).
const (
	familyName    = "nbd"
	familyVersion = 1
)

// Command is an nbd generic netlink command.
type Command uint8

// Commands of the nbd family.
const (
	CmdConnect     Command = 1
	CmdDisconnect  Command = 2
	CmdReconfigure Command = 3
	CmdLinkDead    Command = 4
	CmdStatus      Command = 5
)

// Attribute types of the nbd family.
const (
	attrIndex             uint16 = 1
	attrSizeBytes         uint16 = 2
	attrBlockSizeBytes    uint16 = 3
	attrTimeout           uint16 = 4
	attrServerFlags       uint16 = 5
	attrClientFlags       uint16 = 6
	attrSockets           uint16 = 7
	attrDeadConnTimeout   uint16 = 8
	attrDeviceList        uint16 = 9
	attrBackendIdentifier uint16 = 10

	sockItem uint16 = 1
	sockFD   uint16 = 1

	deviceItem      uint16 = 1
	deviceIndex     uint16 = 1
	deviceConnected uint16 = 2
)

// ErrNoNBD is returned by Dial when the kernel has no nbd family (module not loaded).
// On kernels whose nbd family lives only in the initial network namespace, a process in
// another namespace gets it too (DialNetNS).
var ErrNoNBD = errors.New("kernel: no nbd generic netlink family (is the nbd module loaded, and is this the host's network namespace?)")

// Config describes a device for Connect and Reconfigure.
type Config struct {
	// Size of the device in bytes.
	Size int64
	// BlockSize is the logical block size (default 4096).
	BlockSize int64
	// Timeout of one request; when it expires the kernel requeues the request on another
	// (or a reconfigured) connection. Zero keeps the kernel's default.
	Timeout time.Duration
	// DeadConnTimeout is how long requests wait for a connection when all are dead.
	DeadConnTimeout time.Duration
	// ServerFlags are the export's transmission flags (nbd.Server.Flags).
	ServerFlags uint64
	// BackendID identifies the owner; the kernel refuses a RECONFIGURE that names another.
	BackendID string
	// Sockets are the kernel's ends of the connections. The caller closes them after the
	// call: the kernel holds its own reference.
	Sockets []*os.File
}

// DeviceStatus is one entry of NBD_CMD_STATUS.
type DeviceStatus struct {
	Index     uint32
	Connected bool
}

// Netlink talks to the kernel's nbd family.
type Netlink struct {
	c      *genetlink.Conn
	family genetlink.Family
}

// Dial opens a generic netlink socket in the calling thread's network namespace and
// resolves the nbd family (DialNetNS with no namespace).
func Dial() (*Netlink, error) { return DialNetNS("") }

// DialNetNS opens the generic netlink socket in the network namespace of the file netns
// (a namespace file such as /proc/1/ns/net, or one bound under /run/netns) and resolves
// the nbd family there; "" is the calling thread's namespace. A socket belongs to the
// namespace it was created in for its whole life, so only the creation enters netns: it runs
// on a locked OS thread that setns()es into it and back (github.com/mdlayher/socket), and no
// other goroutine ever sees the switch.
//
// Why: older kernels, Debian 12's 6.1 among them, register the nbd family without netnsok
// (drivers/block/nbd.c), so it exists only in the initial network namespace: a node plugin
// in a pod with a network namespace of its own finds no family there (ErrNoNBD) and must
// dial the host's.
func DialNetNS(netns string) (*Netlink, error) {
	var cfg netlink.Config
	if netns != "" {
		f, err := os.Open(netns)
		if err != nil {
			return nil, fmt.Errorf("kernel: network namespace for netlink: %w", err)
		}
		defer func() { _ = f.Close() }()
		cfg.NetNS = int(f.Fd())
	}
	c, err := genetlink.Dial(&cfg)
	if err != nil {
		if netns != "" {
			return nil, fmt.Errorf("kernel: dial generic netlink in the network namespace %s (a namespace file, and CAP_SYS_ADMIN to enter it): %w", netns, err)
		}
		return nil, fmt.Errorf("kernel: dial generic netlink: %w", err)
	}
	f, err := c.GetFamily(familyName)
	if err != nil {
		_ = c.Close()
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNoNBD
		}
		return nil, fmt.Errorf("kernel: resolve nbd family: %w", err)
	}
	return &Netlink{c: c, family: f}, nil
}

// Close closes the netlink socket. Attached devices stay attached.
func (n *Netlink) Close() error { return n.c.Close() }

func (n *Netlink) execute(cmd Command, flags netlink.HeaderFlags, encode func(ae *netlink.AttributeEncoder)) ([]genetlink.Message, error) {
	ae := netlink.NewAttributeEncoder()
	encode(ae)
	data, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	return n.c.Execute(genetlink.Message{
		Header: genetlink.Header{Command: uint8(cmd), Version: familyVersion},
		Data:   data,
	}, n.family.ID, netlink.Request|flags)
}

func encodeConfig(ae *netlink.AttributeEncoder, cfg *Config) {
	bs := cfg.BlockSize
	if bs == 0 {
		bs = 4096
	}
	if cfg.Size > 0 {
		ae.Uint64(attrSizeBytes, uint64(cfg.Size))
		ae.Uint64(attrBlockSizeBytes, uint64(bs))
	}
	if cfg.Timeout > 0 {
		ae.Uint64(attrTimeout, uint64(max(cfg.Timeout/time.Second, 1)))
	}
	if cfg.DeadConnTimeout > 0 {
		ae.Uint64(attrDeadConnTimeout, uint64(max(cfg.DeadConnTimeout/time.Second, 1)))
	}
	if cfg.BackendID != "" {
		ae.String(attrBackendIdentifier, cfg.BackendID)
	}
	if len(cfg.Sockets) > 0 {
		ae.Nested(attrSockets, func(nae *netlink.AttributeEncoder) error {
			for _, f := range cfg.Sockets {
				nae.Nested(sockItem, func(s *netlink.AttributeEncoder) error {
					s.Uint32(sockFD, uint32(f.Fd()))
					return nil
				})
			}
			return nil
		})
	}
}

// Connect configures a device with cfg and returns its index. index < 0 lets the kernel pick
// an unconfigured device (creating one if none is free); a configured device is never taken
// (EBUSY).
func (n *Netlink) Connect(index int, cfg Config) (uint32, error) {
	msgs, err := n.execute(CmdConnect, 0, func(ae *netlink.AttributeEncoder) {
		if index >= 0 {
			ae.Uint32(attrIndex, uint32(index))
		}
		encodeConfig(ae, &cfg)
		ae.Uint64(attrServerFlags, cfg.ServerFlags)
		ae.Uint64(attrClientFlags, 0) // neither destroy nor disconnect on close
	})
	if err != nil {
		return 0, fmt.Errorf("kernel: NBD_CMD_CONNECT: %w", err)
	}
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return 0, err
		}
		for ad.Next() {
			if ad.Type() == attrIndex {
				return ad.Uint32(), nil
			}
		}
	}
	return 0, errors.New("kernel: NBD_CMD_CONNECT: no index in the reply")
}

// Reconfigure hands fresh sockets (replacing dead connections) and timeouts to a configured
// device. The kernel refuses it (EINVAL) when cfg.BackendID differs from the device's.
// Sockets beyond the number of dead connections are silently dropped by the kernel.
func (n *Netlink) Reconfigure(index uint32, cfg Config) error {
	cfg.Size = 0 // never resize on reconfigure
	_, err := n.execute(CmdReconfigure, netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrIndex, index)
		encodeConfig(ae, &cfg)
	})
	if err != nil {
		return fmt.Errorf("kernel: NBD_CMD_RECONFIGURE nbd%d: %w", index, err)
	}
	return nil
}

// Resize sets the size of a configured device in place with NBD_CMD_RECONFIGURE carrying
// NBD_ATTR_SIZE_BYTES and NBD_ATTR_BLOCK_SIZE_BYTES (and the backend identifier, which the
// kernel checks), without sockets: the connections, the queue and whatever is mounted on the
// device stay as they are. The kernel (nbd_genl_reconfigure -> nbd_genl_size_set ->
// nbd_set_size, since Linux 5.3) updates the capacity with set_capacity_and_notify, which
// emits a change uevent with RESIZE=1; a mounted filesystem can then be grown. blockSize 0
// means 4096.
func (n *Netlink) Resize(index uint32, backendID string, size, blockSize int64) error {
	if size <= 0 {
		return fmt.Errorf("kernel: resize nbd%d: size %d must be positive", index, size)
	}
	cfg := Config{Size: size, BlockSize: blockSize, BackendID: backendID}
	_, err := n.execute(CmdReconfigure, netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrIndex, index)
		encodeConfig(ae, &cfg)
	})
	if err != nil {
		return fmt.Errorf("kernel: NBD_CMD_RECONFIGURE (size %d) nbd%d: %w", size, index, err)
	}
	return nil
}

// Disconnect sends NBD_CMD_DISC on every connection of the device and tears it down;
// requests still queued fail.
func (n *Netlink) Disconnect(index uint32) error {
	_, err := n.execute(CmdDisconnect, netlink.Acknowledge, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(attrIndex, index)
	})
	if err != nil {
		return fmt.Errorf("kernel: NBD_CMD_DISCONNECT nbd%d: %w", index, err)
	}
	return nil
}

// Status lists the devices (index < 0) or one device, and whether each is configured.
func (n *Netlink) Status(index int) ([]DeviceStatus, error) {
	msgs, err := n.execute(CmdStatus, 0, func(ae *netlink.AttributeEncoder) {
		if index >= 0 {
			ae.Uint32(attrIndex, uint32(index))
		}
	})
	if err != nil {
		return nil, fmt.Errorf("kernel: NBD_CMD_STATUS: %w", err)
	}
	var out []DeviceStatus
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data)
		if err != nil {
			return nil, err
		}
		for ad.Next() {
			if ad.Type() != attrDeviceList {
				continue
			}
			ad.Nested(func(list *netlink.AttributeDecoder) error {
				for list.Next() {
					if list.Type() != deviceItem {
						continue
					}
					var d DeviceStatus
					list.Nested(func(item *netlink.AttributeDecoder) error {
						for item.Next() {
							switch item.Type() {
							case deviceIndex:
								d.Index = item.Uint32()
							case deviceConnected:
								d.Connected = item.Uint8() != 0
							}
						}
						return item.Err()
					})
					out = append(out, d)
				}
				return list.Err()
			})
		}
		if err := ad.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// BackendOf reads /sys/block/nbdX/backend: the backend identifier the device was connected
// with, "" when it has none or is not configured.
func BackendOf(index uint32) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/nbd%d/backend", index))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("kernel: read backend of nbd%d: %w", index, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// DeviceSize reads /sys/block/nbdX/size: the device's capacity in bytes as the block layer
// sees it (0 when it is not configured).
func DeviceSize(index uint32) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/sys/block/nbd%d/size", index))
	if err != nil {
		return 0, fmt.Errorf("kernel: read size of nbd%d: %w", index, err)
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kernel: size of nbd%d: %w", index, err)
	}
	return sectors * 512, nil
}

// DevicePath is the block device node of an index.
func DevicePath(index uint32) string { return fmt.Sprintf("/dev/nbd%d", index) }
