package plugin

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
	"github.com/raid10-csi/raid10-csi/pkg/driver"
)

// controllerClients returns the controller's two views of the API server, as userAgent,
// with o's kubeconfig and client rate limit (restConfig): an uncached controller-runtime
// client for the raid10 types that can also watch (the controller's waits for the node
// agent watch the volume they wait for), and GetCapacity's informer cache
// (driver.CachedStore).
func controllerClients(o *Options, userAgent string) (client.WithWatch, *driver.CachedStore, error) {
	cfg, err := restConfig(o)
	if err != nil {
		return nil, nil, err
	}
	cfg.UserAgent = userAgent
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, err
	}
	// The cache's informers log through controller-runtime's logger: to klog, as the node
	// agent's do (which sets the same in node mode).
	ctrllog.SetLogger(klog.NewKlogr())
	cs, err := driver.NewCachedStore(cfg, scheme)
	return c, cs, err
}

// restConfig loads the kube client configuration from o.Kubeconfig, else the in-cluster
// config, else $KUBECONFIG or ~/.kube/config, with the client-side rate limit of
// --kube-api-qps and --kube-api-burst (0 leaves client-go's defaults, 5 and 10; a negative
// QPS: no client-side limit).
func restConfig(o *Options) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if o.Kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kube client config: %w", err)
	}
	if o.KubeAPIQPS != 0 {
		cfg.QPS = float32(o.KubeAPIQPS)
	}
	if o.KubeAPIBurst > 0 {
		cfg.Burst = o.KubeAPIBurst
	}
	return cfg, nil
}
