#!/usr/bin/env bash
# Regenerates the API's deepcopy functions and the CRDs (charts/raid10-csi/crds/) with the
# pinned controller-gen, in the checkout this script lives in or in the tree given as $1
# (hack/verify-generated.sh passes a scratch copy).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${1:-$here/..}
# shellcheck source=hack/versions.sh
source "$here/versions.sh"
# shellcheck source=hack/csi-tools.sh
source "$here/csi-tools.sh"
cg=$(csi_tool controller-gen)
cd "$root"
"$cg" object paths=./pkg/apis/...
rm -f charts/raid10-csi/crds/*.yaml
"$cg" crd paths=./pkg/apis/... output:crd:artifacts:config=charts/raid10-csi/crds

# The snapshot.storage.k8s.io CRDs the chart installs with snapshots.installCRDs (and the
# e2e tests install), from external-snapshotter's client/v8 module at the version of
# csi-snapshotter (SNAPSHOTTER_VERSION of hack/versions.sh), read from the module
# cache.
snapdir=$(cd "$(mktemp -d)" && GOWORK=off GOFLAGS=-mod=mod go mod download -json \
  "github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
[[ -d $snapdir/config/crd ]] || { echo "update-codegen: no config/crd in external-snapshotter client/v8@$SNAPSHOTTER_VERSION" >&2; exit 1; }
rm -f charts/raid10-csi/charts/snapshot-crds/crds/*.yaml
mkdir -p charts/raid10-csi/charts/snapshot-crds/crds
for kind in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
  {
    echo "# From github.com/kubernetes-csi/external-snapshotter/client/v8@$SNAPSHOTTER_VERSION"
    echo "# config/crd/snapshot.storage.k8s.io_$kind.yaml; copied by hack/update-codegen.sh."
    cat "$snapdir/config/crd/snapshot.storage.k8s.io_$kind.yaml"
  } >"charts/raid10-csi/charts/snapshot-crds/crds/snapshot.storage.k8s.io_$kind.yaml"
done
