# The version of every tool that hack/ builds or installs, in one table: the scripts source
# this file (bash) and the Makefile includes it (make), so each line is a plain NAME=value
# with its comment on the lines above (make would keep the blanks before a trailing comment).
#
# Each tool is cached under ${RAID10_CACHE:-~/.cache/raid10-csi}/<name>-<version>: a new
# version here is a new cache directory, built on the next `make deps`; the old one stays
# until removed by hand.
# shellcheck shell=bash disable=SC2034

# k8s.io/kubernetes: kube-apiserver and kube-controller-manager (test/kubeenv), kube-scheduler,
# kubelet and kubectl (test/cluster), built by hack/build-tools.sh. Also the Kubernetes
# version the chart is rendered for (hack/render-deploy.sh: helm template --kube-version).
KUBE_VERSION=v1.37.2

# go.etcd.io/etcd/server/v3: the etcd behind test/kubeenv's kube-apiserver: the release that
# KUBE_VERSION's go.mod requires, so that it builds in hack/build-tools.sh's shared module.
ETCD_VERSION=v3.7.0

# github.com/kubernetes-csi/external-provisioner/v6: the csi-provisioner sidecar of test/e2e
# (hack/build-tools.sh); the same version as its image in charts/raid10-csi/values.yaml. A
# release built on KUBE_VERSION's k8s.io minor (or the one before), so that the shared module
# compiles client-go and its neighbours once for every tool.
PROVISIONER_VERSION=v6.4.0

# github.com/kubernetes-csi/external-resizer/v2: the csi-resizer sidecar of test/e2e
# (hack/build-tools.sh); the same version as its image in charts/raid10-csi/values.yaml, on
# KUBE_VERSION's k8s.io minor like the provisioner.
RESIZER_VERSION=v2.3.0

# github.com/kubernetes-csi/external-snapshotter/v8: csi-snapshotter and snapshot-controller
# (hack/build-tools.sh, test/e2e), and the snapshot CRDs of its client/v8 module that the
# chart ships (hack/update-codegen.sh); the same version as their images in
# charts/raid10-csi/values.yaml; on KUBE_VERSION's k8s.io minor like the provisioner.
SNAPSHOTTER_VERSION=v8.7.0

# sigs.k8s.io/controller-tools: controller-gen writes the deepcopy functions and the CRDs
# (hack/csi-tools.sh, hack/update-codegen.sh).
CONTROLLER_GEN_VERSION=v0.23.0

# helm.sh/helm/v3: renders the chart into deploy/ (hack/render-deploy.sh) and in test/deploy's
# chart tests (hack/csi-tools.sh).
HELM_VERSION=v3.22.0

# github.com/yannh/kubeconform: validates the rendered manifests in test/deploy
# (hack/csi-tools.sh).
KUBECONFORM_VERSION=v0.8.0

# github.com/golangci/golangci-lint/v2: `make lint`, with the linter list of .golangci.yml
# (v2 configuration format).
GOLANGCI_VERSION=v2.15.0

# Debian trixie-backports' newest kernel (linux-binary-<version>: vmlinuz; linux-modules-<version>:
# xz-compressed modules): unpacked, never installed, into
# ${RAID10_CACHE:-~/.cache/raid10-csi}/kernel-<version> by hack/install-deps.sh; test/vm boots it
# for vm.NewestKernelSeries (the ublk tests that need 6.16+: UPDATE_SIZE, zero copy, per-I/O
# daemons, batching). Must be a release the suite still serves (backports keep one or two).
NEWEST_KERNEL_VERSION=7.3.4+deb13-amd64
