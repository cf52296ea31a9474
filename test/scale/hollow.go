package scale

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	mount "k8s.io/mount-utils"
	testingexec "k8s.io/utils/exec/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/agent"
	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// NodeConfig describes one hollow node.
type NodeConfig struct {
	// Name is the node's name (Node, CSINode, Raid10Node, topology raid10.csi.io/node).
	Name string
	// Disks is the number of in-memory disks (default 4) of DiskSize bytes (default 64 GiB;
	// sparse, so the size costs no memory).
	Disks    int
	DiskSize int64
	// PollInterval is the agent's (agent.Options.PollInterval); 0: its default.
	PollInterval time.Duration
}

// Node is a hollow node: the real node agent (agent.NewManager, its three controllers and
// its poller) over a real pool (pool.Open, the real allocator and arrays) whose disks are
// MemDisks, and the real CSI node service for its identity (NodeGetInfo), registered as a
// kubelet would: a Node labelled with the topology NodeGetInfo reports and a CSINode naming
// the driver. Nothing is attached, staged or mounted.
type Node struct {
	Name string
	// Started is when StartNode began: the node's disk state is in its pool from then on.
	Started time.Time
	Pool    *pool.Pool
	CSI     *driver.NodeServer
	Disks   []*MemDisk

	cancel context.CancelFunc
	done   chan error
}

// StartNode opens the node's pool, registers the node through admin (Node and CSINode, as
// the kubelet and its plugin registration do) and runs its agent against the API server of
// cfg until Stop.
func StartNode(ctx context.Context, cfg *rest.Config, admin client.Client, nc NodeConfig) (*Node, error) {
	if nc.Disks == 0 {
		nc.Disks = 4
	}
	if nc.DiskSize == 0 {
		nc.DiskSize = 64 << 30
	}
	n := &Node{Name: nc.Name, Started: time.Now()}
	p, disks, err := openMemPool(nc.Name, nc.Disks, nc.DiskSize, DefaultPageSize)
	if err != nil {
		return nil, fmt.Errorf("hollow node %s: %w", nc.Name, err)
	}
	n.Pool, n.Disks = p, disks
	if err := n.register(ctx, admin); err != nil {
		_ = p.Close()
		return nil, err
	}
	mgr, err := agent.NewManager(cfg, nc.Name)
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("hollow node %s: manager: %w", nc.Name, err)
	}
	a, err := agent.New(agent.Options{NodeName: nc.Name, Pool: p, PollInterval: nc.PollInterval}, mgr.GetClient(), mgr.GetEventRecorder("raid10.csi.io/node-agent"))
	if err == nil {
		err = a.SetupWithManager(mgr)
	}
	if err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("hollow node %s: agent: %w", nc.Name, err)
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- mgr.Start(actx) }()
	return n, nil
}

// openMemPool opens (creating it) the pool named name over n new MemDisks of size bytes,
// kept in pages of pageSize bytes.
func openMemPool(name string, n int, size, pageSize int64) (*pool.Pool, []*MemDisk, error) {
	byPath := map[string]*MemDisk{}
	disks := make([]*MemDisk, 0, n)
	pc := pool.Config{Name: name, OpenDisk: func(path string) (raid10.Member, error) {
		if d, ok := byPath[path]; ok {
			return d, nil
		}
		return nil, fmt.Errorf("hollow node %s has no disk %s", name, path)
	}}
	for i := range n {
		path := fmt.Sprintf("mem/%s/disk%d", name, i)
		d := NewMemDiskPages(size, pageSize)
		byPath[path] = d
		disks = append(disks, d)
		pc.Disks = append(pc.Disks, pool.DiskConfig{Path: path})
	}
	p, err := pool.Open(pc)
	if err != nil {
		return nil, nil, fmt.Errorf("pool: %w", err)
	}
	return p, disks, nil
}

// register builds the node's CSI node service, asks it NodeGetInfo and creates the Node
// (labels: the topology segments) and the CSINode (the driver, its node ID and topology
// keys) that the kubelet would. Existing objects are kept.
func (n *Node) register(ctx context.Context, admin client.Client) error {
	ns, err := driver.NewNodeServer(driver.NodeConfig{
		NodeID: n.Name, Attacher: noDataPath{n.Pool}, Mounter: mount.NewFakeMounter(nil), Exec: &testingexec.FakeExec{},
	})
	if err != nil {
		return fmt.Errorf("hollow node %s: node service: %w", n.Name, err)
	}
	n.CSI = ns
	info, err := ns.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return fmt.Errorf("hollow node %s: NodeGetInfo: %w", n.Name, err)
	}
	labels := map[string]string{"kubernetes.io/hostname": n.Name}
	var keys []string
	for k, v := range info.GetAccessibleTopology().GetSegments() {
		labels[k] = v
		keys = append(keys, k)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}}
	switch err := admin.Create(ctx, node); {
	case err == nil:
		// What a kubelet reports, so that kube-scheduler can place pods here (the bench's
		// claims): room for pods, Ready. Nothing renews it; the clusters that schedule
		// run no node lifecycle controller, so the not-ready taint that the API server's
		// TaintNodesByCondition admission gave the new Node is removed here, as that
		// controller would once the node is Ready.
		node.Status = hollowNodeStatus()
		if err := admin.Status().Update(ctx, node); err != nil {
			return fmt.Errorf("hollow node %s: Node status: %w", n.Name, err)
		}
		if len(node.Spec.Taints) > 0 {
			node.Spec.Taints = nil
			if err := admin.Update(ctx, node); err != nil {
				return fmt.Errorf("hollow node %s: Node taints: %w", n.Name, err)
			}
		}
	case !apierrors.IsAlreadyExists(err):
		return fmt.Errorf("hollow node %s: create Node: %w", n.Name, err)
	}
	count := int32(info.GetMaxVolumesPerNode())
	cn := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{
			Name: v1alpha1.DriverName, NodeID: info.GetNodeId(), TopologyKeys: keys,
			Allocatable: &storagev1.VolumeNodeResources{Count: &count},
		}}},
	}
	if err := admin.Create(ctx, cn); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("hollow node %s: create CSINode: %w", n.Name, err)
	}
	return nil
}

// hollowNodeStatus is a hollow Node's status: capacity for 110 pods, Ready.
func hollowNodeStatus() corev1.NodeStatus {
	res := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("16"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
	}
	now := metav1.Now()
	return corev1.NodeStatus{
		Capacity: res, Allocatable: res,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "HollowNode",
			Message: "hollow node: the real agent, no kubelet", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
	}
}

// Stop stops the agent and closes the pool. The API objects stay.
func (n *Node) Stop() error {
	n.cancel()
	err := <-n.done
	return errors.Join(err, n.Pool.Close())
}

// Resident is the memory the node's disks hold (labels, superblocks, bitmaps), in bytes.
func (n *Node) Resident() int64 {
	var t int64
	for _, d := range n.Disks {
		t += d.Resident()
	}
	return t
}

// noDataPath is the hollow node's attacher: volume states from the pool, and no device:
// staging is not part of a hollow node.
type noDataPath struct{ p *pool.Pool }

var errNoDataPath = errors.New("hollow node: no data path (nothing is attached, staged or mounted)")

func (noDataPath) Attach(context.Context, string) (string, error) { return "", errNoDataPath }
func (noDataPath) Detach(context.Context, string) error           { return nil }
func (noDataPath) Expand(context.Context, string) (int64, error)  { return 0, errNoDataPath }
func (noDataPath) Device(string) string                           { return "" }

func (d noDataPath) Volume(_ context.Context, id string) (attach.VolumeState, error) {
	v, err := d.p.Volume(id)
	if err != nil {
		if errors.Is(err, pool.ErrNotFound) {
			return attach.VolumeState{}, fmt.Errorf("%w: %w", driver.ErrNotFound, err)
		}
		return attach.VolumeState{}, err
	}
	return attach.VolumeState{SizeBytes: int64(v.Size), Abnormal: v.Health != pool.Healthy, Message: v.Reason}, nil
}
