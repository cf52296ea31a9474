// Package suite is Kubernetes' external storage e2e suites (k8s.io/kubernetes
// test/e2e/storage/external) as one test binary, e2e.test, for the raid10-csi driver that
// ../driver.yaml describes. It is its own Go module, so that neither the product's go.mod nor
// the rig runner's (test/k8se2e) sees k8s.io/kubernetes's test tree; its go.mod replaces the
// staging modules that k8s.io/kubernetes takes from ./staging with their released v0.X.Y, and
// names agnhost (the suites' test image) as a tool of the same version.
// hack/build-k8s-e2e.sh builds both into the tool cache and `make k8s-e2e` runs them on the
// test/cluster rig (issue 25).
package suite
