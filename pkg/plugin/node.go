package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/raid10-csi/raid10-csi/pkg/attach"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
	"github.com/raid10-csi/raid10-csi/pkg/nbd/kernel"
	"github.com/raid10-csi/raid10-csi/pkg/pool"
)

// nodePlugin is what the node and all modes share: the pool, the NBD attacher over it, and
// the CSI node service.
type nodePlugin struct {
	pool     *pool.Pool
	attacher *attach.PoolAttacher
	ns       *driver.NodeServer
}

// openNodePlugin opens the pool of --pool-config and the attacher with its state file in
// --state-dir (adopting the devices a predecessor or the holder hands over, reattaching the
// others recorded there), and builds the node service. waiting is called when a predecessor
// that still serves tells this process to wait for its devices (takeHandover).
func openNodePlugin(ctx context.Context, o *Options, waiting func()) (*nodePlugin, error) {
	pc, err := poolConfig(o)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir: %w", err)
	}
	// Before any handover: a node that cannot serve the frontend fails here, while a
	// predecessor still serves.
	fe, _ := attach.ParseFrontend(o.Frontend) // checked by Validate
	if fe, err = attach.ResolveFrontend(fe); err != nil {
		return nil, err
	}
	// A predecessor still serving the state directory closes its arrays and hands its
	// devices over before this process opens the pool: the same disks are never open twice.
	var handed []kernel.Handed
	var p *pool.Pool
	var deadline time.Time
	for {
		if handed, err = takeHandover(ctx, o.StateDir, waiting); err != nil {
			return nil, err
		}
		if deadline.IsZero() { // from the end of a wait for a predecessor, however long
			deadline = time.Now().Add(handoverTimeout)
		}
		p, err = pool.Open(pc)
		if err == nil {
			break
		}
		for i := range handed {
			handed[i].Close()
		}
		// A predecessor still closing its arrays for the holder: its devices come next.
		if !errors.Is(err, pool.ErrDiskInUse) || len(handed) > 0 || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
	np := &nodePlugin{pool: p}
	np.attacher, err = attach.OpenPoolAttacher(ctx, p, filepath.Join(o.StateDir, "nbd-state.json"), nbdAttachOptions(o), handed...)
	if err != nil {
		np.close()
		return nil, err
	}
	if err := np.attacher.EnableUblk(ctx, fe, filepath.Join(o.StateDir, attach.UblkStateFile)); err != nil {
		np.close()
		return nil, err
	}
	np.ns, err = driver.NewNodeServer(driver.NodeConfig{NodeID: o.NodeID, MaxVolumes: o.MaxVolumes,
		Attacher: np.attacher, Mounter: mount.New(""), Exec: utilexec.New(), Pool: p, Crypt: o.Crypt})
	if err != nil {
		np.close()
		return nil, err
	}
	return np, nil
}

// poolConfig reads --pool-config, with --member-timeout over its memberTimeout and, unless
// the file sets disksFile, the pool's record of the disks given at run time in --state-dir
// (pool.DisksFileName): a disk replaced or added onto a path the configuration does not list
// stays in the pool across restarts.
func poolConfig(o *Options) (pool.Config, error) {
	pc, err := pool.LoadConfig(o.PoolConfig)
	if err != nil {
		return pc, err
	}
	if pc.DisksFile == "" {
		pc.DisksFile = filepath.Join(o.StateDir, pool.DisksFileName)
	}
	if o.MemberTimeout != 0 {
		pc.MemberTimeout = pool.Duration(o.MemberTimeout)
	}
	return pc, nil
}

// close stops serving the NBD devices, which stay attached (a restarted plugin reattaches
// them), and closes the pool.
func (np *nodePlugin) close() {
	if np.attacher != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		np.attacher.Close(sctx)
	}
	if err := np.pool.Close(); err != nil {
		klog.ErrorS(err, "Closing the pool")
	}
}
