#!/usr/bin/env bash
# The pinned Go-built tools of the CSI layer: controller-gen (CRDs, deepcopy), helm (renders
# the chart into deploy/) and kubeconform (validates the rendered manifests), cached under the
# tool cache keyed by its version in hack/versions.sh. hack/build-tools.sh (`make deps`)
# builds them there with the Kubernetes binaries, sharing their compiles; a tool still
# missing when csi_tool asks for it is built alone with `go install`.
#
#   bash hack/csi-tools.sh              # builds all three
#   source hack/csi-tools.sh; csi_tool helm   # prints the binary's path, building it if missing
set -euo pipefail

CSI_TOOLS_CACHE=${RAID10_CACHE:-$HOME/.cache/raid10-csi}
# CONTROLLER_GEN_VERSION, HELM_VERSION, KUBECONFORM_VERSION.
# shellcheck source=hack/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"

# csi_tool NAME prints the path of the pinned NAME binary, installing it first if needed.
csi_tool() {
  local name=$1 module version
  case "$name" in
    controller-gen) module=sigs.k8s.io/controller-tools/cmd/controller-gen; version=$CONTROLLER_GEN_VERSION ;;
    helm) module=helm.sh/helm/v3/cmd/helm; version=$HELM_VERSION ;;
    kubeconform) module=github.com/yannh/kubeconform/cmd/kubeconform; version=$KUBECONFORM_VERSION ;;
    *) echo "csi-tools: unknown tool $name" >&2; return 1 ;;
  esac
  local dir=$CSI_TOOLS_CACHE/$name-$version
  if [[ ! -x $dir/$name ]]; then
    echo "csi-tools: building $name $version (go install $module)" >&2
    mkdir -p "$dir"
    # Outside the module so that the tool's own go.mod pins its dependencies.
    (cd / && GOFLAGS= GOBIN=$dir go install "$module@$version") >&2
  fi
  echo "$dir/$name"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  for t in controller-gen helm kubeconform; do
    echo "csi-tools: $t at $(csi_tool "$t")"
  done
fi
