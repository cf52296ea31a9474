package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
	"github.com/raid10-csi/raid10-csi/pkg/raid10"
)

// Pool is the part of the node's disk pool the agent drives. *pool.Pool implements it.
type Pool interface {
	// CreateVolume creates a volume of at least size bytes over opts.Members disks;
	// idempotent by name and size. Errors wrap pool.ErrNoSpace, pool.ErrInvalidArgument, ...
	CreateVolume(name string, size uint64, opts pool.CreateOptions) (pool.VolumeInfo, error)
	// ExpandVolume grows a volume in place; pool.ErrDegraded while it is not Healthy.
	ExpandVolume(name string, newSize uint64) (pool.VolumeInfo, error)
	// DeleteVolume frees a volume's extents; a missing volume is success.
	DeleteVolume(name string) error
	// Volume describes one volume; pool.ErrNotFound when there is none of that name.
	Volume(name string) (pool.VolumeInfo, error)
	// Status snapshots the pool: capacity, disks and volumes.
	Status() pool.Status
	// MemberFree is the data one new member extent can hold on each Active disk, by UUID.
	MemberFree() map[string]uint64
	// ReplaceDisk replaces a Failed or Missing disk (ref: UUID, path or serial/WWN) with
	// another; the affected volumes rebuild onto it. Errors wrap pool.ErrNotFound,
	// pool.ErrFailedPrecondition (an active disk, one already replaced), pool.ErrOtherPool, ...
	ReplaceDisk(ref string, with pool.DiskConfig) (pool.DiskInfo, error)
	// StartScrub starts a check or repair of a volume in the background (VolumeInfo.Scrub
	// follows it); one of the same kind running is success. Errors wrap
	// pool.ErrFailedPrecondition (a member not in sync, the other kind running), ...
	StartScrub(name string, kind pool.ScrubKind) (pool.ScrubInfo, error)
	// RecordScrubCompleted tells the pool's scrub schedule when the volume's last scrub
	// reached the end before the pool opened (from status.scrub).
	RecordScrubCompleted(name string, at time.Time) error
	// CreateSnapshot cuts a snapshot of volume source and returns once the cut is durable;
	// the copy runs in the background (SnapshotInfo.Ready, Copied). Idempotent by name.
	// Errors wrap pool.ErrNotFound (no such source), pool.ErrAlreadyExists (that name from
	// another source), pool.ErrNoSpace (nothing allocated), ...
	CreateSnapshot(name, source string) (pool.SnapshotInfo, error)
	// DeleteSnapshot frees a snapshot's extents; a missing one is success.
	// pool.ErrFailedPrecondition while a restore still copies from it.
	DeleteSnapshot(name string) error
	// Snapshot describes one snapshot; pool.ErrNotFound when there is none of that name.
	Snapshot(name string) (pool.SnapshotInfo, error)
	// SetVolumeLimits puts QoS limits on a volume: at once on its running array, else when
	// it is assembled; kept in the pool's memory only. Errors wrap pool.ErrNotFound,
	// pool.ErrInvalidArgument (a negative field), ...
	SetVolumeLimits(name string, l raid10.Limits) error
	// SetVolumeRates sets a volume's rebuild and scrub rates (a field of 0: the node's), at
	// once on its running array, else when it is assembled; kept in memory only. Errors wrap
	// pool.ErrNotFound, pool.ErrInvalidArgument (a negative field), ...
	SetVolumeRates(name string, r raid10.Rates) error
	// SetVolumeScrubSchedule gives a volume a scrub schedule of its own (nil: the node's);
	// kept in memory only. Errors wrap pool.ErrNotFound, pool.ErrInvalidArgument (naming the
	// field), ...
	SetVolumeScrubSchedule(name string, c *pool.ScrubConfig) error
}

var _ Pool = (*pool.Pool)(nil)

// Devices is the node's NBD attacher as the agent sees it: which device serves a volume
// (reported as status.devicePath) and growing that device after the pool grew the array.
// The node plugin's attach.PoolAttacher implements it. The agent is the only writer of the
// status; the attacher only answers.
type Devices interface {
	// Device returns the device path the volume is attached on, "" when it is not attached.
	Device(volumeID string) string
	// Expand makes the volume's attached device as large as its array (a no-op when it is)
	// and returns the device's size in bytes.
	Expand(ctx context.Context, volumeID string) (int64, error)
}

// Recorder records Kubernetes Events (events.k8s.io/v1). The recorder of a
// controller-runtime manager (manager.GetEventRecorder) implements it.
type Recorder interface {
	// Eventf records an event about regarding; note is a format for args.
	Eventf(regarding runtime.Object, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Event reasons.
const (
	EventDiskFailed          = "DiskFailed"
	EventDegraded            = "Degraded"
	EventRebuildStarted      = "RebuildStarted"
	EventRebuildFinished     = "RebuildFinished"
	EventVolumeFailed        = "VolumeFailed"
	EventProvisioned         = "Provisioned"
	EventProvisionFailed     = "ProvisioningFailed"
	EventExpanded            = "Expanded"
	EventExpandFailed        = "ExpansionFailed"
	EventDeleted             = "ExtentsFreed"
	EventDeleteFailed        = "DeleteFailed"
	EventDeleteWaiting       = "DeleteWaiting"
	EventDiskReturned        = "DiskHealthy"
	EventBadBlocks           = "BadBlocks"
	EventSnapshotCut         = "SnapshotCut"
	EventSnapshotReady       = "SnapshotReady"
	EventSnapshotFailed      = "SnapshotFailed"
	EventSnapshotDeleted     = "SnapshotDeleted"
	EventHydrated            = "Hydrated"
	EventLimitsSet           = "LimitsSet"
	EventLimitsFailed        = "LimitsFailed"
	EventRatesSet            = "RatesSet"
	EventRatesFailed         = "RatesFailed"
	EventScrubScheduleSet    = "ScrubScheduleSet"
	EventScrubScheduleFailed = "ScrubScheduleFailed"
	eventRecorderComponent   = "raid10.csi.io/node-agent"
)

// DefaultPollInterval is how often the agent compares pool.Status with what it reported.
// Status follows a change within this interval plus one API round trip.
const DefaultPollInterval = time.Second

// Options configure an Agent.
type Options struct {
	// NodeName is the Kubernetes node the agent runs on: it reconciles the Raid10Volumes
	// whose spec.node is this name and keeps the Raid10Node of this name. Required.
	NodeName string
	// Pool is the node's open disk pool. Required.
	Pool Pool
	// PollInterval is how often pool status is compared with the reported status;
	// default DefaultPollInterval.
	PollInterval time.Duration
	// Devices, when set, gives status.devicePath and grows an attached volume's device right
	// after the array (a Block volume sees its new size before NodeExpandVolume even runs).
	// Without it devicePath is left as it is.
	Devices Devices
}

// Validate reports the first missing or invalid option.
func (o Options) Validate() error {
	switch {
	case o.NodeName == "":
		return errors.New("agent: NodeName is required")
	case o.Pool == nil:
		return errors.New("agent: Pool is required")
	case o.PollInterval < 0:
		return fmt.Errorf("agent: PollInterval %v must not be negative", o.PollInterval)
	}
	return nil
}

// Agent is the node agent. Create it with New, add it to a manager with SetupWithManager.
type Agent struct {
	node     string
	pool     Pool
	c        client.Client
	rec      Recorder
	interval time.Duration
	devices  Devices // nil: no device reporting

	volumeCh   chan event.TypedGenericEvent[*v1alpha1.Raid10Volume]
	nodeCh     chan event.TypedGenericEvent[*v1alpha1.Raid10Node]
	snapshotCh chan event.TypedGenericEvent[*v1alpha1.Raid10Snapshot]

	// mu guards the maps below. They hold what the agent last reported, so that Events fire
	// once per transition even when the cache has not yet seen the agent's own writes.
	mu          sync.Mutex
	volumeSeen  map[string]volumeSeen
	diskSeen    map[string]v1alpha1.DiskState // by disk ID; nil until the first node reconcile
	fingerprint map[string]string             // poller: per volume name, and nodeKey for the node
	snapSeen    map[string]bool               // per snapshot: ready last reported, for Events
	snapPrint   map[string]string             // poller: per snapshot name
	limits      map[string]raid10.Limits      // per volume: the limits last put on the pool
	rates       map[string]raid10.Rates       // per volume: the rates last put on the pool
	// scrubSchedules per volume: the scrub schedule last put on the pool (zero: the node's)
	scrubSchedules map[string]pool.ScrubConfig
}

// volumeSeen is what the agent last reported about a volume, for Events.
type volumeSeen struct {
	health     v1alpha1.VolumeHealth
	rebuilding bool
	expandMsg  string
	badBlocks  int64
	lostBlocks int64
	scrub      string // scrubSeen of the last scrub reported
}

// nodeKey is the poller's fingerprint key of the Raid10Node (not a valid volume name).
const nodeKey = "/node"

// New returns an agent that talks to the API server through c and records Events with rec.
func New(opts Options, c client.Client, rec Recorder) (*Agent, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = DefaultPollInterval
	}
	return &Agent{
		node: opts.NodeName, pool: opts.Pool, c: c, rec: rec, interval: opts.PollInterval, devices: opts.Devices,
		volumeCh:       make(chan event.TypedGenericEvent[*v1alpha1.Raid10Volume], 256),
		nodeCh:         make(chan event.TypedGenericEvent[*v1alpha1.Raid10Node], 4),
		snapshotCh:     make(chan event.TypedGenericEvent[*v1alpha1.Raid10Snapshot], 256),
		snapSeen:       map[string]bool{},
		snapPrint:      map[string]string{},
		volumeSeen:     map[string]volumeSeen{},
		fingerprint:    map[string]string{},
		limits:         map[string]raid10.Limits{},
		rates:          map[string]raid10.Rates{},
		scrubSchedules: map[string]pool.ScrubConfig{},
	}, nil
}

// SetupWithManager registers the agent's controllers (Raid10Volume, Raid10Snapshot and
// Raid10Node) and
// its poller with mgr. The manager's scheme must include v1alpha1. For a manager that
// caches only this node's objects, see NewManager.
func (a *Agent) SetupWithManager(mgr manager.Manager) error {
	onNode := predicate.NewPredicateFuncs(func(o client.Object) bool {
		v, ok := o.(*v1alpha1.Raid10Volume)
		return ok && v.Spec.Node == a.node
	})
	// Own status writes change neither the generation nor the deletion timestamp: they do
	// not come back as reconciles (the poller covers the pool's side).
	changed := predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			return e.ObjectNew.GetDeletionTimestamp() != nil ||
				len(e.ObjectNew.GetFinalizers()) != len(e.ObjectOld.GetFinalizers())
		},
	})
	// One process may run several agents (tests): controller names need not be unique.
	skipNameValidation := true
	opts := controller.Options{SkipNameValidation: &skipNameValidation}
	if err := builder.ControllerManagedBy(mgr).Named("raid10volume-agent").WithOptions(opts).
		For(&v1alpha1.Raid10Volume{}, builder.WithPredicates(onNode, changed)).
		WatchesRawSource(source.Channel(a.volumeCh, &handler.TypedEnqueueRequestForObject[*v1alpha1.Raid10Volume]{})).
		Complete(reconcile.Func(a.reconcileVolume)); err != nil {
		return fmt.Errorf("agent: volume controller: %w", err)
	}
	snapOnNode := predicate.NewPredicateFuncs(func(o client.Object) bool {
		v, ok := o.(*v1alpha1.Raid10Snapshot)
		return ok && v.Spec.Node == a.node
	})
	if err := builder.ControllerManagedBy(mgr).Named("raid10snapshot-agent").WithOptions(opts).
		For(&v1alpha1.Raid10Snapshot{}, builder.WithPredicates(snapOnNode, changed)).
		WatchesRawSource(source.Channel(a.snapshotCh, &handler.TypedEnqueueRequestForObject[*v1alpha1.Raid10Snapshot]{})).
		Complete(reconcile.Func(a.reconcileSnapshot)); err != nil {
		return fmt.Errorf("agent: snapshot controller: %w", err)
	}
	isNode := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetName() == a.node })
	if err := builder.ControllerManagedBy(mgr).Named("raid10node-agent").WithOptions(opts).
		For(&v1alpha1.Raid10Node{}, builder.WithPredicates(isNode, predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(a.nodeCh, &handler.TypedEnqueueRequestForObject[*v1alpha1.Raid10Node]{})).
		Complete(reconcile.Func(a.reconcileNode)); err != nil {
		return fmt.Errorf("agent: node controller: %w", err)
	}
	return mgr.Add(manager.RunnableFunc(a.poll))
}

// Scheme returns a scheme with the Kubernetes built-in types and v1alpha1.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// NewManager returns a manager whose cache holds only node's Raid10Volumes and
// Raid10Snapshots (by the CRDs' selectable field spec.node) and its Raid10Node. It serves no metrics and no probes of its
// own (pkg/metrics does) and runs without leader election: every node runs its own agent.
func NewManager(cfg *rest.Config, node string) (manager.Manager, error) {
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	return manager.New(cfg, manager.Options{
		Scheme:                 s,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.Raid10Volume{}:   {Field: fields.OneTermEqualSelector("spec.node", node)},
			&v1alpha1.Raid10Snapshot{}: {Field: fields.OneTermEqualSelector("spec.node", node)},
			&v1alpha1.Raid10Node{}:     {Field: fields.OneTermEqualSelector("metadata.name", node)},
		}},
	})
}

// Run runs the agent for opts against the API server of cfg until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	// controller-runtime logs (and hands reconcilers a logger) through klog.
	ctrllog.SetLogger(klog.NewKlogr())
	mgr, err := NewManager(cfg, opts.NodeName)
	if err != nil {
		return fmt.Errorf("agent: manager: %w", err)
	}
	a, err := New(opts, mgr.GetClient(), mgr.GetEventRecorder(eventRecorderComponent))
	if err != nil {
		return err
	}
	if err := a.SetupWithManager(mgr); err != nil {
		return err
	}
	klog.InfoS("Node agent starting", "nodeID", opts.NodeName, "pollInterval", a.interval)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// poll compares the pool's state with the last one it saw, every interval, and enqueues
// the volumes (and the node) whose reportable state changed: health, member states,
// rebuild percent, capacity, bad blocks and member timeouts. It runs until ctx is done.
func (a *Agent) poll(ctx context.Context) error {
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		a.pollOnce()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (a *Agent) pollOnce() {
	ps := a.pool.Status()
	free := a.pool.MemberFree()
	var changed []string
	nodeChanged := false
	a.mu.Lock()
	live := map[string]bool{nodeKey: true}
	for _, v := range ps.Volumes {
		live[v.Name] = true
		fp := volumeFingerprint(v)
		if a.devices != nil {
			fp += "|" + a.devices.Device(v.Name) // an attach or detach changes devicePath
		}
		if a.fingerprint[v.Name] != fp {
			a.fingerprint[v.Name] = fp
			changed = append(changed, v.Name)
		}
	}
	var snapsChanged []string
	liveSnap := map[string]bool{}
	for _, sn := range ps.Snapshots {
		liveSnap[sn.Name] = true
		fp := fmt.Sprintf("%v|%d|%s|%d", sn.Ready, sn.Copied*100/max(sn.Size, 1), sn.Health, sn.Members)
		if a.snapPrint[sn.Name] != fp {
			a.snapPrint[sn.Name] = fp
			snapsChanged = append(snapsChanged, sn.Name)
		}
	}
	for k := range a.snapPrint {
		if !liveSnap[k] {
			delete(a.snapPrint, k)
		}
	}
	if fp := nodeFingerprint(ps, free); a.fingerprint[nodeKey] != fp {
		a.fingerprint[nodeKey] = fp
		nodeChanged = true
	}
	for k := range a.fingerprint {
		if !live[k] {
			delete(a.fingerprint, k)
		}
	}
	a.mu.Unlock()
	for _, name := range changed {
		a.enqueueVolume(name)
	}
	for _, name := range snapsChanged {
		a.enqueueSnapshot(name)
	}
	if nodeChanged {
		a.enqueueNode()
	}
}

func (a *Agent) enqueueSnapshot(name string) {
	v := &v1alpha1.Raid10Snapshot{}
	v.Name = name
	select {
	case a.snapshotCh <- event.TypedGenericEvent[*v1alpha1.Raid10Snapshot]{Object: v}:
	default:
		a.mu.Lock()
		delete(a.snapPrint, name)
		a.mu.Unlock()
	}
}

func (a *Agent) enqueueVolume(name string) {
	v := &v1alpha1.Raid10Volume{}
	v.Name = name
	select {
	case a.volumeCh <- event.TypedGenericEvent[*v1alpha1.Raid10Volume]{Object: v}:
	default:
		// The queue is full: forget the fingerprint so that the next poll sends it again.
		a.mu.Lock()
		delete(a.fingerprint, name)
		a.mu.Unlock()
	}
}

func (a *Agent) enqueueNode() {
	n := &v1alpha1.Raid10Node{}
	n.Name = a.node
	select {
	case a.nodeCh <- event.TypedGenericEvent[*v1alpha1.Raid10Node]{Object: n}:
	default: // a node reconcile is already queued; it reads the newest pool state
	}
}

func volumeFingerprint(v pool.VolumeInfo) string {
	s := fmt.Sprintf("%d|%s|%d|%s|%d|%d|", v.Size, v.Health, v.InSync, v.Reason, v.BadBlocks, v.LostBlocks)
	for _, m := range v.Members {
		s += fmt.Sprintf("%s:%s:%d:%d,", m.DiskUUID, m.State, m.BadBlocks, m.TimedOut)
	}
	if p := v.Sync; p != nil {
		s += fmt.Sprintf("|%s %d", p.Kind, int(p.Percent))
	}
	if v.Source != nil {
		s += fmt.Sprintf("|hydrated %v %d", v.Hydrated, v.Copied*100/max(v.Size, 1))
	}
	if sc := v.Scrub; sc != nil {
		s += fmt.Sprintf("|scrub %s %s %d %d", sc.State, sc.Kind, int(sc.Percent), sc.Mismatches)
	}
	return s
}

func nodeFingerprint(ps pool.Status, free map[string]uint64) string {
	s := fmt.Sprintf("%+v|", ps.Capacity)
	for _, d := range ps.Disks {
		s += fmt.Sprintf("%s:%s:%s:%d:%d:%s,", d.UUID, d.Path, d.Status, d.Size, free[d.UUID], d.Reason)
	}
	return s
}
