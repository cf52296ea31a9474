#!/usr/bin/env bash
# Builds the test tools from pinned Go modules and caches them outside the checkout:
#
#   ${RAID10_CACHE:-~/.cache/raid10-csi}/<name>-<version>/<binary>
#
# Every tool is built in ONE throwaway module under a temporary directory (so the project's
# go.mod never sees kube-apiserver's dependency tree) that requires all of them at their
# pins: minimal version selection gives the Kubernetes binaries, etcd, the CSI sidecars and
# the CSI layer's tools (helm, controller-gen, kubeconform; hack/csi-tools.sh) one
# version of each shared dependency (client-go, apimachinery, grpc, protobuf,
# OpenTelemetry...), so each shared package is compiled once for all of them instead of once
# per tool; the pins in hack/versions.sh are chosen so that they agree (KUBE_VERSION's go.mod
# requires ETCD_VERSION; the sidecars' releases build on the same k8s.io minor). A pin that
# the shared module resolves to another version fails the build with both versions named.
#
# A binary already in the cache that runs `--version` is not built again, so a second run
# (even from a fresh clone) only checks, and does not create the module. At the end the
# script writes ${RAID10_CACHE}/env.sh, which hack/tool-env.sh sources before `go test`:
#
#   RAID10_KUBE_BIN_DIR     etcd, kube-apiserver, kube-controller-manager (test/kubeenv);
#                           kube-scheduler, kubelet, kubectl (test/cluster)
#   RAID10_CSI_PROVISIONER  the external-provisioner sidecar, csi-provisioner (test/e2e)
#   RAID10_CSI_RESIZER      the external-resizer sidecar, csi-resizer (test/e2e)
#   RAID10_CSI_SNAPSHOTTER  the external-snapshotter sidecar, csi-snapshotter (test/e2e)
#   RAID10_SNAPSHOT_CONTROLLER  the external-snapshotter's snapshot-controller (test/e2e)
#
# To add a tool, pin its version in hack/versions.sh, add its module to MODULES and one
# build_go_tool call (and, if the tests need it, an env_export line) in main below.
# Usage: hack/build-tools.sh  (set RAID10_CACHE to move the cache)
set -euo pipefail

# The versions (KUBE_VERSION, ETCD_VERSION, PROVISIONER_VERSION, RESIZER_VERSION,
# SNAPSHOTTER_VERSION) and why each is pinned: hack/versions.sh.
# shellcheck source=hack/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
# The k8s.io/<staging> modules released with KUBE_VERSION: v1.X.Y is published as v0.X.Y.
STAGING_VERSION=v0.${KUBE_VERSION#v1.}

CACHE=${RAID10_CACHE:-$HOME/.cache/raid10-csi}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

# Tool builds: reproducible paths, static binaries, the project's Go toolchain only.
export GOFLAGS="-trimpath -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local
export GOWORK=off

WORK=$(mktemp -d "${TMPDIR:-/tmp}/raid10-build-tools.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log() { echo "build-tools: $*" >&2; }

# binary_ok PATH: the cached binary exists and prints its version (--version; kubectl:
# version --client; helm: version; kubeconform: -v).
binary_ok() {
  [[ -x $1 ]] || return 1
  case $(basename "$1") in
    kubectl) "$1" version --client >/dev/null 2>&1 ;;
    helm) "$1" version >/dev/null 2>&1 ;;
    kubeconform) "$1" -v >/dev/null 2>&1 ;;
    *) "$1" --version >/dev/null 2>&1 ;;
  esac
}

# kube_staging_replaces DIR: k8s.io/kubernetes's go.mod requires the k8s.io/<staging>
# modules at v0.0.0 and replaces them with ./staging/...; a module that depends on
# k8s.io/kubernetes (the shared module) must replace each of them with its released version. The list
# is read from k8s.io/kubernetes's own go.mod, so it follows the pinned version.
kube_staging_replaces() {
  local dir=$1 gomod staging
  gomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
  [[ -f $gomod ]] || { log "cannot find the go.mod of k8s.io/kubernetes@$KUBE_VERSION"; return 1; }
  # Lines are "k8s.io/x => ./staging/src/k8s.io/x" inside a replace block, or the same
  # after a "replace" keyword.
  staging=$(awk '{ if ($1 == "replace") { $1 = ""; $0 = $0 } }
                 $2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod" | sort -u)
  [[ -n $staging ]] || { log "no ./staging replaces in $gomod"; return 1; }
  local args=() m
  for m in $staging; do args+=("-replace=$m=$m@$STAGING_VERSION"); done
  (cd "$dir" && go mod edit "${args[@]}")
  log "k8s.io/kubernetes@$KUBE_VERSION: replaced $(wc -w <<<"$staging") staging modules with $STAGING_VERSION"
}

# The modules the tools come from, at their pins: the one throwaway module requires them all.
MODULES=(
  "k8s.io/kubernetes@$KUBE_VERSION"
  "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  "github.com/kubernetes-csi/external-provisioner/v6@$PROVISIONER_VERSION"
  "github.com/kubernetes-csi/external-resizer/v2@$RESIZER_VERSION"
  "github.com/kubernetes-csi/external-snapshotter/v8@$SNAPSHOTTER_VERSION"
  "helm.sh/helm/v3@$HELM_VERSION"
  "sigs.k8s.io/controller-tools@$CONTROLLER_GEN_VERSION"
  "github.com/yannh/kubeconform@$KUBECONFORM_VERSION"
)

# The project's checkout (its go.mod joins the shared module's requirements).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# A module's version as a module resolves it: {{.Version}}, or its replacement's.
VERSION_FORMAT='{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}'

# tools_module sets MODULE_DIR to the shared throwaway module, creating it on the first call
# (call it in this shell, not in $(...), or the next call creates it again): it requires
# every MODULES pin and the project's own build list, replaces k8s.io/kubernetes's staging
# modules, resolves the packages of PACKAGES, and checks that each pin resolved to itself.
#
# Why the project's build list: a compiled package is reused from the Go build cache only
# if its flags (the same here and in the project's non-race builds: CGO_ENABLED=0
# -trimpath) and every dependency below it are the same versions. With the project's
# requirements in, minimal version selection gives the tools the project's version of every
# module they share, or a newer one; when the project's go.mod holds at least the tools'
# versions (a line below names any module where it does not), the project's lint and
# non-race test builds reuse the tools' compiles of client-go, apimachinery, grpc... instead
# of compiling them again (issue 24).
MODULE_DIR=""
PACKAGES=()
tools_module() {
  [[ -z $MODULE_DIR ]] || return 0
  local dir=$WORK/tools start=$SECONDS m args=() ours
  mkdir -p "$dir"
  for m in "${MODULES[@]}"; do args+=("-require=$m"); done
  ours=$(cd "$ROOT" && go list -m -f '{{if not .Main}}{{.Path}}@{{.Version}}{{end}}' all)
  for m in $ours; do args+=("-require=$m"); done
  (
    cd "$dir"
    go mod init raid10-csi-tools >/dev/null 2>&1
    go mod edit "${args[@]}"
    kube_staging_replaces "$dir"
    go get "${PACKAGES[@]}" >get.log 2>&1 || { cat get.log >&2; exit 1; }
    local got path want
    for m in "${MODULES[@]}"; do
      got=$(go list -m -f '{{.Version}}' "${m%@*}")
      [[ $got == "${m#*@}" ]] || { log "${m%@*}: pinned ${m#*@}, but the shared module resolves $got (hack/versions.sh)"; exit 1; }
    done
    # Modules the project builds packages of, and the tools need newer than the project's
    # go.mod has: the project compiles them, and every package above them, a second time.
    # Not an error; `go get` them in the project to share.
    local built modules='{{with .Module}}{{if not .Main}}{{.Path}}{{end}}{{end}}'
    built=$(comm -12 <(go list -deps -f "$modules" "${PACKAGES[@]%@*}" | sort -u) \
      <(cd "$ROOT" && go list -deps -test -f "$modules" ./... | sort -u))
    while read -r path got; do
      grep -qxF "$path" <<<"$built" || continue
      want=$(awk -F@ -v p="$path" '$1 == p { print $2; exit }' <<<"$ours")
      [[ -z $want || $got == "$want" ]] ||
        log "note: the tools need $path $got, the project's go.mod has $want (go get $path@$got shares its compiles)"
    done < <(go list -m -f "$VERSION_FORMAT" all)
  ) >&2
  log "shared module of ${#MODULES[@]} modules and the project's $(wc -w <<<"$ours") ready in $((SECONDS - start))s"
  MODULE_DIR=$dir
}

# build_go_tool KEY BINARY=PACKAGE...
#   Builds each PACKAGE in the shared module into $CACHE/KEY/BINARY, unless that binary is
#   already there and runs --version. LDFLAGS=... in the call's environment adds -ldflags
#   (e.g. -X version stamps).
build_go_tool() {
  local key=$1
  shift
  local out=$CACHE/$key spec bin pkgs=() bins=()
  mkdir -p "$out"
  for spec in "$@"; do
    bin=${spec%%=*}
    if binary_ok "$out/$bin"; then
      log "$key/$bin: cached ($out/$bin)"
    else
      bins+=("$bin")
      pkgs+=("${spec#*=}")
    fi
  done
  ((${#pkgs[@]})) || return 0

  local start=$SECONDS
  tools_module
  # All of the key's binaries in one go build (into a scratch directory, each named after
  # its package's last element): the go command schedules their compiles and links as one
  # graph, so one binary's link (single-threaded, tens of seconds for kube-apiserver) runs
  # beside another's compiles instead of leaving a CPU idle, as one build per binary did.
  local tmp=$out/.build i
  rm -rf "$tmp"
  mkdir -p "$tmp"
  (cd "$MODULE_DIR" && go build -ldflags="-s -w ${LDFLAGS:-}" -o "$tmp/" "${pkgs[@]}")
  local name
  for i in "${!pkgs[@]}"; do
    # go build's name for a package's binary: its last path element, or the one before a
    # major version suffix (go.etcd.io/etcd/server/v3: server).
    name=$(basename "${pkgs[$i]}")
    [[ $name =~ ^v[0-9]+$ ]] && name=$(basename "$(dirname "${pkgs[$i]}")")
    mv -f "$tmp/$name" "$out/${bins[$i]}"
    binary_ok "$out/${bins[$i]}" || { log "$out/${bins[$i]} does not run --version"; return 1; }
  done
  rm -rf "$tmp"
  log "$key: built ${bins[*]} in $((SECONDS - start))s"
}

# Lines for $CACHE/env.sh, collected by env_export and written once at the end.
ENV_LINES=()
env_export() { ENV_LINES+=("export $1=$(printf %q "$2")"); }

# link_dir NAME FILE...: a directory $CACHE/bin-NAME of symlinks to FILEs (one place for a
# tool set whose binaries are cached under different version keys).
link_dir() {
  local d=$CACHE/bin-$1 f
  shift
  mkdir -p "$d"
  for f in "$@"; do ln -sfn "$f" "$d/$(basename "$f")"; done
  echo "$d"
}

main() {
  # Two runs at once (two clones, two make targets) would build the same thing twice.
  exec 9>"$CACHE/.build-tools.lock"
  flock 9
  local total=$SECONDS
  if [[ -n ${1:-} ]]; then
    log "unknown argument $1 (usage: hack/build-tools.sh)"
    return 2
  fi
  local k=k8s.io/kubernetes/cmd prov=github.com/kubernetes-csi/external-provisioner/v6
  local rsz=github.com/kubernetes-csi/external-resizer/v2 snap=github.com/kubernetes-csi/external-snapshotter/v8
  # What the shared module resolves, each package at its module's pin.
  PACKAGES=(
    "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    "$k/kube-apiserver@$KUBE_VERSION" "$k/kube-controller-manager@$KUBE_VERSION"
    "$k/kube-scheduler@$KUBE_VERSION" "$k/kubelet@$KUBE_VERSION" "$k/kubectl@$KUBE_VERSION"
    "$prov/cmd/csi-provisioner@$PROVISIONER_VERSION" "$rsz/cmd/csi-resizer@$RESIZER_VERSION"
    "$snap/cmd/csi-snapshotter@$SNAPSHOTTER_VERSION" "$snap/cmd/snapshot-controller@$SNAPSHOTTER_VERSION"
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION"
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
  )

  # kube-apiserver first: it compiles most of what the others share.
  local kv=k8s.io/component-base/version minor=${KUBE_VERSION#v*.}
  minor=${minor%%.*}
  LDFLAGS="-X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor -X $kv.gitTreeState=clean" \
    build_go_tool "kube-$KUBE_VERSION" \
    kube-apiserver=$k/kube-apiserver kube-controller-manager=$k/kube-controller-manager \
    kube-scheduler=$k/kube-scheduler kubelet=$k/kubelet kubectl=$k/kubectl
  build_go_tool "etcd-$ETCD_VERSION" etcd=go.etcd.io/etcd/server/v3

  env_export RAID10_KUBE_BIN_DIR "$(link_dir "kube-$KUBE_VERSION-etcd-$ETCD_VERSION" \
    "$CACHE/etcd-$ETCD_VERSION/etcd" \
    "$CACHE/kube-$KUBE_VERSION/kube-apiserver" \
    "$CACHE/kube-$KUBE_VERSION/kube-controller-manager" \
    "$CACHE/kube-$KUBE_VERSION/kube-scheduler" \
    "$CACHE/kube-$KUBE_VERSION/kubelet" \
    "$CACHE/kube-$KUBE_VERSION/kubectl")"

  # The real sidecar that turns PVCs into CreateVolume calls and publishes CSIStorageCapacity.
  LDFLAGS="-X main.version=$PROVISIONER_VERSION" \
    build_go_tool "csi-provisioner-$PROVISIONER_VERSION" csi-provisioner=$prov/cmd/csi-provisioner
  env_export RAID10_CSI_PROVISIONER "$CACHE/csi-provisioner-$PROVISIONER_VERSION/csi-provisioner"
  # It turns a claim's larger request into ControllerExpandVolume.
  LDFLAGS="-X main.version=$RESIZER_VERSION" \
    build_go_tool "csi-resizer-$RESIZER_VERSION" csi-resizer=$rsz/cmd/csi-resizer
  env_export RAID10_CSI_RESIZER "$CACHE/csi-resizer-$RESIZER_VERSION/csi-resizer"
  # The snapshot sidecar (VolumeSnapshotContent -> CreateSnapshot/DeleteSnapshot) and the
  # cluster's snapshot-controller (VolumeSnapshot -> VolumeSnapshotContent), one module.
  LDFLAGS="-X main.version=$SNAPSHOTTER_VERSION" \
    build_go_tool "external-snapshotter-$SNAPSHOTTER_VERSION" \
    csi-snapshotter=$snap/cmd/csi-snapshotter snapshot-controller=$snap/cmd/snapshot-controller
  env_export RAID10_CSI_SNAPSHOTTER "$CACHE/external-snapshotter-$SNAPSHOTTER_VERSION/csi-snapshotter"
  env_export RAID10_SNAPSHOT_CONTROLLER "$CACHE/external-snapshotter-$SNAPSHOTTER_VERSION/snapshot-controller"

  # The CSI layer's tools (hack/csi-tools.sh finds them here, in the directories its own `go
  # install` fallback uses): helm (deploy/, the story's installs), controller-gen (CRDs,
  # deepcopy) and kubeconform. Built in the shared module they compile the Kubernetes
  # libraries (v0.37.0 in their own go.mod, v0.37.2 here) once with the binaries above;
  # `make verify` built them on its own and took 210 s of a cold run (issue 24). Their
  # version stamps are set as their releases set them: controller-gen writes its version
  # into every CRD, and reads it from the main module, which is not its own here.
  LDFLAGS="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    build_go_tool "helm-$HELM_VERSION" helm=helm.sh/helm/v3/cmd/helm
  LDFLAGS="-X sigs.k8s.io/controller-tools/pkg/version.version=$CONTROLLER_GEN_VERSION" \
    build_go_tool "controller-gen-$CONTROLLER_GEN_VERSION" controller-gen=sigs.k8s.io/controller-tools/cmd/controller-gen
  LDFLAGS="-X main.version=$KUBECONFORM_VERSION" \
    build_go_tool "kubeconform-$KUBECONFORM_VERSION" kubeconform=github.com/yannh/kubeconform/cmd/kubeconform

  {
    echo "# Written by hack/build-tools.sh; sourced by hack/tool-env.sh."
    printf '%s\n' "${ENV_LINES[@]}"
  } >"$CACHE/env.sh.tmp"
  mv -f "$CACHE/env.sh.tmp" "$CACHE/env.sh"
  log "wrote $CACHE/env.sh; all tools ready in $((SECONDS - total))s"
}

main "$@"
