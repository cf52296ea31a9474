#!/usr/bin/env bash
# Regenerates generated files (deepcopy, CRDs, deploy manifests) in a scratch copy and diffs
# them against the committed ones. Each generator adds itself here as it lands.
set -euo pipefail
cd "$(dirname "$0")/.."

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The tracked and untracked (not ignored) files, as the working tree has them.
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [[ -e $f ]] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$scratch"

# CRDs and deepcopy (controller-gen), then deploy/ (helm template).
bash hack/update-codegen.sh "$scratch" >/dev/null
bash hack/render-deploy.sh "$scratch" >/dev/null

status=0
for path in pkg/apis charts/raid10-csi/crds charts/raid10-csi/charts/snapshot-crds/crds deploy; do
  if ! diff -ruN "$path" "$scratch/$path"; then
    echo "verify-generated: $path is stale; run hack/update-codegen.sh and hack/render-deploy.sh" >&2
    status=1
  fi
done
[[ $status -eq 0 ]] && echo "verify-generated: deepcopy, CRDs and deploy/ are current"
exit $status
