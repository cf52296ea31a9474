package plugin

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/crypt"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// ModeHolder is --mode=holder: the process that keeps a stopped node plugin's NBD devices
// for the next one (Holder), run beside the node plugin and updated separately.
const ModeHolder driver.Mode = "holder"

// DefaultMetricsAddress is the default of --metrics-address.
const DefaultMetricsAddress = ":9810"

// DefaultHandoverWait is the default of --handover-wait.
const DefaultHandoverWait = 10 * time.Second

// Options holds the command-line configuration.
type Options struct {
	Mode         driver.Mode
	Version      string // the binary's, reported by the identity service and in user agents
	Endpoint     string
	NodeID       string
	Kubeconfig   string
	ReadyTimeout time.Duration
	// KubeAPIQPS and KubeAPIBurst are the client-side rate limit of the Kubernetes client
	// (controller and node modes: --kube-api-qps, --kube-api-burst): requests per second and
	// the burst above that rate, for each kind of object the client reads or writes; 0 leaves
	// client-go's defaults (5 and 10); a negative QPS turns the client-side limit off (the API
	// server's priority and fairness alone, as controller-runtime's own default config).
	KubeAPIQPS   float64
	KubeAPIBurst int
	// Node and all modes.
	PoolConfig string
	StateDir   string
	MaxVolumes int64
	// MemberTimeout, when not 0, overrides the pool configuration's memberTimeout: the
	// deadline of one member request (negative: off).
	MemberTimeout time.Duration
	// MetricsAddress is where /metrics, /healthz and /readyz are served; empty: nowhere.
	MetricsAddress string
	// HandoverWait is how long a node plugin told to stop keeps serving while it waits for
	// a successor to hand its devices to (Run's stop sequence); 0: it stops at once.
	HandoverWait time.Duration
	// NetlinkNetNS is the network namespace file the kernel's nbd netlink family is dialed
	// in (node and all modes): /proc/1/ns/net with the host's PID namespace reaches the
	// host's, where kernels before netns-aware nbd keep the family. Empty: our own.
	NetlinkNetNS string
	// NBDMaxRequestKiB is the largest request the block layer sends a volume's /dev/nbdX
	// (its queue/max_sectors_kb, kernel.Options.MaxRequestKiB); 0 leaves the kernel's
	// default (128 KiB).
	NBDMaxRequestKiB int
	// Frontend is how the node serves a volume whose StorageClass names none: auto, nbd or
	// ublk (attach.ResolveFrontend: auto is ublk where the kernel's ublk_drv has all a volume
	// needs, online resize included, else nbd).
	Frontend string
	// RegistrationDir is the kubelet's plugins_registry directory the node mode registers
	// the driver in (driver.Registration); empty: no self-registration.
	RegistrationDir string
	// KubeletRegistrationPath is the CSI socket's path on the host, reported to the kubelet;
	// empty: the path of a unix --endpoint (right when the plugin runs on the host).
	KubeletRegistrationPath string
	// Crypt is the key derivation of new LUKS2 headers of encrypted volumes (node and all
	// modes: --crypt-pbkdf, --crypt-pbkdf-memory-kib, --crypt-iter-time-ms,
	// --crypt-pbkdf-force-iterations); the zero value keeps cryptsetup's defaults.
	Crypt crypt.Options
}

// registrationPath is the CSI endpoint's path as the kubelet sees it.
func (o *Options) registrationPath() string {
	if o.KubeletRegistrationPath != "" {
		return o.KubeletRegistrationPath
	}
	if p, ok := strings.CutPrefix(o.Endpoint, "unix://"); ok {
		return p
	}
	return ""
}

// nbdAttachOptions are the options of the node's NBD attach.
func nbdAttachOptions(o *Options) kernel.Options {
	kib := o.NBDMaxRequestKiB
	if kib == 0 {
		kib = -1 // leave the kernel's default
	}
	return kernel.Options{NetNS: o.NetlinkNetNS, MaxRequestKiB: kib}
}

// Validate reports the first invalid option, naming it.
func (o *Options) Validate() error {
	switch o.Mode {
	case driver.ModeController, driver.ModeNode, driver.ModeAll:
	case ModeHolder:
		if o.StateDir == "" {
			return errors.New("--state-dir: must not be empty in --mode=holder")
		}
		return nil
	default:
		return fmt.Errorf("--mode=%q: must be controller, node, all or holder", o.Mode)
	}
	if o.Endpoint == "" {
		return errors.New("--endpoint: must not be empty")
	}
	if o.Mode != driver.ModeController {
		if o.NodeID == "" {
			return fmt.Errorf("--node-id: must be set in --mode=%s", o.Mode)
		}
		if o.PoolConfig == "" {
			return fmt.Errorf("--pool-config: must be set in --mode=%s", o.Mode)
		}
		if o.StateDir == "" {
			return fmt.Errorf("--state-dir: must not be empty in --mode=%s", o.Mode)
		}
		if o.Mode == driver.ModeNode && o.RegistrationDir != "" {
			if !filepath.IsAbs(o.RegistrationDir) {
				return fmt.Errorf("--registration-dir=%q: must be an absolute path (the kubelet's plugins_registry) or empty", o.RegistrationDir)
			}
			if p := o.registrationPath(); !filepath.IsAbs(p) {
				return fmt.Errorf("--kubelet-registration-path=%q: must be the absolute host path of the CSI socket (needed with --registration-dir unless --endpoint is unix:///absolute/path)", p)
			}
		}
		if o.NetlinkNetNS != "" && !filepath.IsAbs(o.NetlinkNetNS) {
			return fmt.Errorf("--netlink-netns=%q: must be an absolute path to a network namespace file (e.g. /proc/1/ns/net) or empty", o.NetlinkNetNS)
		}
		if _, err := attach.ParseFrontend(o.Frontend); err != nil {
			return fmt.Errorf("--frontend: %w", err)
		}
		if k := o.NBDMaxRequestKiB; k != 0 && (k < 4 || k > 32768 || k%4 != 0) {
			return fmt.Errorf("--nbd-max-request-kib=%d: must be 0 (the kernel's default) or a multiple of 4 from 4 to 32768", k)
		}
		if err := pool.ValidateMemberTimeout(o.MemberTimeout); err != nil {
			return fmt.Errorf("--member-timeout=%s: %w", o.MemberTimeout, err)
		}
		if err := o.Crypt.Validate(); err != nil {
			return fmt.Errorf("--crypt-pbkdf, --crypt-pbkdf-memory-kib, --crypt-iter-time-ms, --crypt-pbkdf-force-iterations: %w", err)
		}
	}
	if o.KubeAPIBurst < 0 {
		return fmt.Errorf("--kube-api-burst=%d: must not be negative (0: client-go's default, 10)", o.KubeAPIBurst)
	}
	if o.HandoverWait < 0 {
		return fmt.Errorf("--handover-wait=%s: must not be negative", o.HandoverWait)
	}
	if o.ReadyTimeout <= 0 {
		return fmt.Errorf("--ready-timeout=%s: must be positive", o.ReadyTimeout)
	}
	if o.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(o.MetricsAddress); err != nil {
			return fmt.Errorf("--metrics-address=%q: must be host:port, :port or empty: %w", o.MetricsAddress, err)
		}
	}
	return nil
}
