#!/usr/bin/env bash
# Builds Kubernetes' external storage e2e suites (the nested module test/k8se2e/suite), the
# agnhost binary of the same k8s.io/kubernetes version (the suites' test image) and the ginkgo
# CLI of the suites' ginkgo version (parallel runs) into the tool cache, once:
#
#   ${RAID10_CACHE:-~/.cache/raid10-csi}/k8s-e2e-<KUBE_VERSION>-<sum>/{e2e.test,agnhost,ginkgo}
#
# <sum> covers test/k8se2e/suite's go.mod, go.sum and Go files, so an edit there builds again; a
# cached e2e.test that prints KUBE_VERSION for --version is kept. Only `make k8s-e2e` calls
# this (never make test or hack/install-deps.sh): the compile is large (most of
# k8s.io/kubernetes's test tree), so it runs under nice -n 15 on a shared machine.
# Prints the cache directory on stdout; logs go to stderr.
# Usage: hack/build-k8s-e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=hack/versions.sh
source hack/versions.sh
CACHE=${RAID10_CACHE:-$HOME/.cache/raid10-csi}
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
MOD=test/k8se2e/suite

export GOFLAGS="-trimpath -buildvcs=false -mod=readonly"
export CGO_ENABLED=0
export GOTOOLCHAIN=local
export GOWORK=off

log() { echo "build-k8s-e2e: $*" >&2; }

# The nested module must require the version the rig runs, or the suites would test another
# release's expectations against it.
got=$(cd "$MOD" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [[ $got != "$KUBE_VERSION" ]]; then
  log "$MOD/go.mod requires k8s.io/kubernetes $got, but hack/versions.sh pins KUBE_VERSION=$KUBE_VERSION"
  exit 1
fi

sum=$(cat "$MOD/go.mod" "$MOD/go.sum" "$MOD"/*.go | sha256sum | cut -c1-12)
out=$CACHE/k8s-e2e-$KUBE_VERSION-$sum
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

if [[ -x $out/e2e.test && -x $out/agnhost && -x $out/ginkgo ]] && [[ $("$out/e2e.test" --version 2>/dev/null) == "$KUBE_VERSION" ]]; then
  log "cached: $out"
  echo "$out"
  exit 0
fi

minor=${KUBE_VERSION#v*.}
minor=${minor%%.*}
kv=k8s.io/component-base/version
ldflags="-s -w -X $kv.gitVersion=$KUBE_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$minor -X $kv.gitTreeState=clean"
t=$SECONDS
(cd "$MOD" && nice -n 15 go test -c -vet=off -ldflags="$ldflags" -o "$out/e2e.test.tmp" .)
mv -f "$out/e2e.test.tmp" "$out/e2e.test"
log "e2e.test built in $((SECONDS - t))s ($(du -m "$out/e2e.test" | cut -f1) MiB)"
t=$SECONDS
(cd "$MOD" && nice -n 15 go build -ldflags="-s -w" -o "$out/agnhost.tmp" k8s.io/kubernetes/test/images/agnhost)
mv -f "$out/agnhost.tmp" "$out/agnhost"
log "agnhost built in $((SECONDS - t))s"
(cd "$MOD" && nice -n 15 go build -ldflags="-s -w" -o "$out/ginkgo.tmp" github.com/onsi/ginkgo/v2/ginkgo)
mv -f "$out/ginkgo.tmp" "$out/ginkgo"
[[ $("$out/e2e.test" --version) == "$KUBE_VERSION" ]] || { log "$out/e2e.test does not print $KUBE_VERSION for --version"; exit 1; }
echo "$out"
