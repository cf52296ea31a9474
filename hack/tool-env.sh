# Sourced by the Makefile: points the tests at the cached tool binaries.
# shellcheck shell=bash
RAID10_CACHE=${RAID10_CACHE:-$HOME/.cache/raid10-csi}
export RAID10_CACHE
if [[ -f "$RAID10_CACHE/env.sh" ]]; then
  # written by hack/build-tools.sh: RAID10_KUBE_BIN_DIR, RAID10_CSI_PROVISIONER, RAID10_CSI_RESIZER,
  # RAID10_CSI_SNAPSHOTTER, RAID10_SNAPSHOT_CONTROLLER
  source "$RAID10_CACHE/env.sh"
fi
