#!/usr/bin/env bash
# `make image`: the plugin image and the pause image as tarballs in _output/image, without
# Docker or a registry. The Dockerfile's final stage says what goes in (hack/image,
# internal/ociimage): its Debian suite and `apt-get install` packages become a root
# filesystem made with mmdebstrap (variant minbase, no recommends, documentation left out as
# in debian:*-slim), cached under ${RAID10_CACHE:-~/.cache/raid10-csi}/image keyed by suite,
# packages and the recipe version below, so a second run skips it; the binaries are built with the
# Dockerfile's flags. Load the results with `docker load -i`, `podman load -i` or
# `ctr -n k8s.io images import`.
#
# --rootfs makes only the cached root filesystem (hack/install-deps.sh: test/cluster's
# TestClusterStory runs this script, and a fresh CI machine makes the root filesystem there).
set -euo pipefail
rootfs_only=false
case ${1:-} in
  --rootfs) rootfs_only=true ;;
  "") ;;
  *) echo "image: unknown argument $1 (usage: hack/image.sh [--rootfs])" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
CACHE=${RAID10_CACHE:-$HOME/.cache/raid10-csi}
out=${IMAGE_OUT:-_output/image}
mkdir -p "$out/bin" "$CACHE/image"
t0=$SECONDS

# Every go command here builds with cgo off and -trimpath, the flags of the plugin's build
# below: its compiles are then shared with make lint and the tests' non-race builds.
spec=$(CGO_ENABLED=0 go run -trimpath ./hack/image -print-packages)
read -r suite pkgs <<<"$spec"
# Bump when the mmdebstrap options below change: it is part of the cache key.
recipe=1
key=$(echo "$recipe $suite $pkgs" | sha256sum | cut -c1-16)
rootfs=$CACHE/image/rootfs-$suite-$key.tar
if [[ -f $rootfs && -s $rootfs ]]; then
  echo "image: root filesystem cached: $rootfs"
else
  if ! command -v mmdebstrap >/dev/null; then
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends mmdebstrap
  fi
  echo "image: making the $suite root filesystem with: $pkgs (mmdebstrap, a few minutes)"
  tmp=${rootfs%.tar}.partial.tar
  rm -rf "$tmp"
  mmdebstrap --quiet --format=tar --variant=minbase --include="${pkgs// /,}" \
    --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    "$suite" "$tmp"
  mv "$tmp" "$rootfs"
  echo "image: root filesystem made in $((SECONDS - t0))s: $rootfs"
fi
if $rootfs_only; then
  exit 0
fi

# The Dockerfile's build stage: static binaries, trimmed paths, no symbols.
for cmd in raid10-csi kubectl-raid10; do
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out/bin/$cmd" "./cmd/$cmd"
done
CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out/bin/pause" ./hack/pause
# The CSI sidecars the chart runs, from the binaries hack/build-tools.sh built from their Go
# modules (their paths in ${RAID10_CACHE}/env.sh), tagged raid10-csi/<name>:<version>.
sidecars=()
if [[ -f $CACHE/env.sh ]]; then
  # shellcheck disable=SC1091
  source "$CACHE/env.sh"
  for bin in "${RAID10_CSI_PROVISIONER:-}" "${RAID10_CSI_RESIZER:-}" "${RAID10_CSI_SNAPSHOTTER:-}"; do
    [[ -n $bin && -x $bin ]] || continue
    version=$(basename "$(dirname "$bin")") # <name>-<version>, as build-tools.sh caches it
    sidecars+=(-sidecar "raid10-csi/$(basename "$bin"):${version##*-}=$bin")
  done
fi
CGO_ENABLED=0 go run -trimpath ./hack/image -rootfs "$rootfs" -bin "$out/bin" -pause "$out/bin/pause" "${sidecars[@]}" -out "$out"
echo "image: done in $((SECONDS - t0))s"
