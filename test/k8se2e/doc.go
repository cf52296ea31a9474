// Package k8se2e runs Kubernetes' external storage e2e suites against raid10-csi on the
// test/cluster rig (issue 25): the control plane on the host, one node with a real kubelet in
// the QEMU VM, the chart installed with its defaults.
//
//   - suite/ is its own Go module: the e2e.test binary of k8s.io/kubernetes's storage suites
//     at the rig's version (hack/versions.sh KUBE_VERSION), built into the tool cache by
//     hack/build-k8s-e2e.sh together with agnhost, the suites' test image.
//   - driver.yaml is the driver as the suites see it (capabilities, filesystems, sizes,
//     topology); TestDriverYAMLSelectsSuites checks with the binary's --list-tests that each
//     declared capability selects its specs, since the framework ignores an unknown key.
//   - TestK8sE2E (`make k8s-e2e`) builds the images the suites use (busybox from Debian's
//     busybox-static, agnhost from its Go package, busybox stand-ins where a suite only needs a
//     shell), boots the rig with them, installs the chart and the snapshot controller, and
//     runs e2e.test against it with KUBE_TEST_REPO_LIST naming the offline images.
//
// This directory is a Go module of its own (it requires the product's module through a
// replace of ../..), so `make test` and `go test ./...` in the root never run it: it is run
// only when asked for.
package k8se2e
