// Command raid10-csi is the raid10.csi.io CSI plugin: the controller (provisioning through
// Raid10Volume custom resources), the node plugin (RAID10 arrays over local disks served to
// the kernel over NBD), or both in one process without a cluster (--mode=all, standalone).
//
// --mode=controller writes Raid10Volumes through the API server (--kubeconfig, else the
// in-cluster config) and touches no disk.
//
// --mode=node opens the node's disk pool (--pool-config), runs the node agent that reconciles
// the node's Raid10Volumes into it, and serves the CSI node service over it; it reattaches
// the NBD devices recorded in --state-dir first. Disks added or replaced at run time on
// paths the pool configuration does not list are recorded in --state-dir/pool-disks.json
// (pool.Config.DisksFile) and opened again at the next start. Once its CSI endpoint serves, it registers
// itself with the kubelet (the plugin-registration socket in --registration-dir, reporting
// --kubelet-registration-path), so no node-driver-registrar sidecar is needed.
//
// --mode=all needs no cluster: it opens the pool and reattaches devices as --mode=node does,
// and serves identity, controller and node from one endpoint. The controller provisions
// straight in the pool (driver.LocalStore); what the pool cannot hold (volume mode, fsType,
// the CreateVolume name) is kept in --state-dir/volumes.json. Only this node exists:
// topology raid10.csi.io/node=<--node-id>.
//
// The lifecycle of each mode (start, handover, stop sequence) is in pkg/plugin; this command
// parses the flags into plugin.Options and runs it.
//
// In node and all modes the plugin serves the node's admin socket, --state-dir/admin.sock
// (pkg/admin), for `kubectl-raid10 --local`.
//
// Every mode serves /metrics, /healthz and /readyz on --metrics-address (empty: none): CSI
// call counts and latencies; in node and all modes also the pool's volumes and disks and
// each attached volume's NBD requests (with the node agent's controller-runtime metrics in
// node mode). /readyz is 503 until the CSI
// endpoint serves and, in node and all modes, while the pool is closed or an attached
// volume's device has no connection being served.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/plugin"
)

// version is set at link time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

func main() {
	klog.InitFlags(nil)
	o := plugin.Options{Version: version}
	flag.StringVar((*string)(&o.Mode), "mode", string(driver.ModeController), "which services to run: controller (provisioning through the API server), node (pool, node agent and CSI node service), all (standalone, no cluster: identity, controller and node over the local pool) or holder (keeps a stopped node plugin's NBD devices for the next one, in --state-dir)")
	flag.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI gRPC endpoint: unix:///path or tcp://host:port")
	flag.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (controller and node modes); empty: in-cluster config, else $KUBECONFIG or ~/.kube/config")
	flag.Float64Var(&o.KubeAPIQPS, "kube-api-qps", 0, "controller and node modes: requests per second the Kubernetes client may send for each kind of object (client-side rate limit); 0: client-go's default, 5; negative: no client-side limit (the API server's priority and fairness alone)")
	flag.IntVar(&o.KubeAPIBurst, "kube-api-burst", 0, "controller and node modes: requests the Kubernetes client may send at once above --kube-api-qps, for each kind of object; 0: client-go's default, 10")
	flag.DurationVar(&o.ReadyTimeout, "ready-timeout", driver.DefaultReadyTimeout, "how long one CSI call waits for the node agent before answering DeadlineExceeded (the sidecar retries); keep it below the sidecar's --timeout")
	flag.StringVar(&o.PoolConfig, "pool-config", "", "JSON pool configuration of this node's disks (node and all modes)")
	flag.StringVar(&o.StateDir, "state-dir", "/var/lib/raid10-csi", "directory kept across restarts (node and all modes): the NBD device state file, the pool's record of the disks added or replaced at run time (pool-disks.json), and in all mode the volume records")
	flag.Int64Var(&o.MaxVolumes, "max-volumes", driver.DefaultMaxVolumesPerNode, "volumes per node that NodeGetInfo reports (max_volumes_per_node: the scheduler places no more pods' volumes on the node)")
	flag.DurationVar(&o.MemberTimeout, "member-timeout", 0, "deadline of one member request (node and all modes): a disk that has not answered within it is failed and the request completes from the other copy; negative: off; 0: the pool configuration's memberTimeout, else 5s. Must stay below the kernel's NBD request timeout less 2s")
	flag.StringVar(&o.MetricsAddress, "metrics-address", plugin.DefaultMetricsAddress, "host:port serving /metrics, /healthz and /readyz over HTTP; empty: none")
	flag.DurationVar(&o.HandoverWait, "handover-wait", plugin.DefaultHandoverWait, "node and all modes: after SIGTERM, how long to keep serving while waiting for a successor process to hand the NBD devices to (no I/O stall); 0: stop at once (requests in flight then wait for the kernel's request timeout)")
	flag.StringVar(&o.NetlinkNetNS, "netlink-netns", "", "node and all modes: the network namespace file to open the kernel's nbd netlink socket in, e.g. /proc/1/ns/net with the pod's hostPID (kernels such as Debian 12's 6.1 have the nbd family only in the host's network namespace); empty: the process's own")
	flag.StringVar(&o.Frontend, "frontend", string(attach.FrontendAuto), "node and all modes: how a volume whose StorageClass names no frontend is served: auto (ublk where the kernel's ublk_drv can also resize a served device, Linux 6.16+; nbd elsewhere), nbd (/dev/nbdX) or ublk (/dev/ublkbN; Linux 6.0+ with ublk_drv loaded; online expansion from 6.16)")
	flag.IntVar(&o.NBDMaxRequestKiB, "nbd-max-request-kib", kernel.DefaultMaxRequestKiB, "node and all modes: the largest request, in KiB, the kernel sends a volume's /dev/nbdX (its queue/max_sectors_kb; the kernel's default of 128 cuts a 1 MiB request into 8); 0: the kernel's default")
	flag.StringVar(&o.RegistrationDir, "registration-dir", driver.DefaultRegistrationDir, "node mode: the kubelet's plugin registration directory; the plugin registers itself there (socket raid10.csi.io-reg.sock), no node-driver-registrar needed; empty: no registration")
	flag.StringVar(&o.KubeletRegistrationPath, "kubelet-registration-path", "", "node mode: the CSI socket's path on the host, as the kubelet dials it (e.g. /var/lib/kubelet/plugins/raid10.csi.io/csi.sock); empty: the path of a unix --endpoint")
	flag.StringVar(&o.Crypt.PBKDF, "crypt-pbkdf", "", "node and all modes: the key derivation of a new encrypted volume's LUKS2 keyslot (cryptsetup --pbkdf): argon2id, argon2i or pbkdf2; empty: cryptsetup's default, argon2id, which production should keep (the other --crypt-* flags make tests and emulated CPUs cheaper)")
	flag.IntVar(&o.Crypt.PBKDFMemoryKiB, "crypt-pbkdf-memory-kib", 0, "node and all modes: the memory argon2 may use for a new keyslot, in KiB (cryptsetup --pbkdf-memory); 0: cryptsetup's default (up to 1 GiB)")
	flag.IntVar(&o.Crypt.IterTimeMs, "crypt-iter-time-ms", 0, "node and all modes: the time a new keyslot's key derivation is tuned to take, in ms (cryptsetup --iter-time); 0: cryptsetup's default (2000)")
	flag.IntVar(&o.Crypt.ForceIterations, "crypt-pbkdf-force-iterations", 0, "node and all modes: a fixed iteration count for a new keyslot, skipping cryptsetup's benchmark (--pbkdf-force-iterations; at least 1000 for pbkdf2, 4 for argon2; not with --crypt-iter-time-ms); 0: benchmarked")
	flag.Parse()

	if err := o.Validate(); err != nil {
		klog.ErrorS(err, "Invalid options")
		klog.FlushAndExit(klog.ExitFlushTimeout, 2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := plugin.Run(ctx, &o); err != nil {
		klog.ErrorS(err, "raid10-csi failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}
