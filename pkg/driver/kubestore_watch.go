package driver

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

var _ VolumeWatcher = (*KubeStore)(nil)

// WatchVolume implements VolumeWatcher: a watch of the API server on the one Raid10Volume
// (field selector metadata.name, from its current state: the API server sends it first). It
// needs a client that can watch (client.WithWatch: client.NewWithWatch, the fake client);
// with another the caller polls.
func (s *KubeStore) WatchVolume(ctx context.Context, name string) (watch.Interface, error) {
	wc, ok := s.c.(client.WithWatch)
	if !ok {
		return nil, fmt.Errorf("watch raid10volume %q: the store's client cannot watch (not a client.WithWatch)", name)
	}
	w, err := wc.Watch(ctx, &v1alpha1.Raid10VolumeList{}, client.MatchingFields{"metadata.name": name})
	if err != nil {
		return nil, fmt.Errorf("watch raid10volume %q: %w", name, err)
	}
	return w, nil
}
