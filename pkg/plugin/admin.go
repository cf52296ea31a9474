package plugin

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/raid10-csi/raid10-csi/pkg/admin"
)

// adminTask returns the task that serves the node's admin socket (pkg/admin: the one the
// standalone agent `kubectl-raid10 --local serve` serves) in --state-dir, over the pool this
// process holds: `kubectl-raid10 --local` (status, disks, volumes, disk operations, wait)
// then works against the running plugin instead of finding its disks in use. Volumes are
// made through CSI here, so the socket does not create, delete or expand them.
func adminTask(stateDir string, np *nodePlugin) func(context.Context) error {
	return func(ctx context.Context) error {
		srv, err := admin.Listen(admin.Socket(stateDir), np.pool, nil)
		if err != nil {
			return err
		}
		klog.InfoS("Admin socket ready", "socket", srv.Addr())
		return srv.Serve(ctx)
	}
}
