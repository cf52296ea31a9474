#!/usr/bin/env bash
# Regenerates the API's deepcopy functions and the CRDs (charts/raid10-csi/crds/) with the
# pinned controller-gen, in the checkout this script lives in or in the tree given as $1
# (hack/verify-generated.sh passes a scratch copy).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${1:-$here/..}
# shellcheck source=hack/csi-tools.sh
source "$here/csi-tools.sh"
cg=$(csi_tool controller-gen)
cd "$root"
"$cg" object paths=./pkg/apis/...
rm -f charts/raid10-csi/crds/*.yaml
"$cg" crd paths=./pkg/apis/... output:crd:artifacts:config=charts/raid10-csi/crds
