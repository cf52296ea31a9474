// Package kubeenv runs a real Kubernetes control plane on the test machine: etcd,
// kube-apiserver and, on request, kube-controller-manager, all on 127.0.0.1, for tests that
// need the API server itself (CRDs, RBAC, the PV binder, the CSI sidecars) rather than a
// fake clientset.
//
//	env := kubeenv.Start(t)                                // etcd + kube-apiserver
//	env := kubeenv.Start(t, kubeenv.WithControllerManager()) // + kube-controller-manager
//	env.Client.CoreV1().Namespaces().Create(...)            // admin (system:masters)
//	cfg := env.ServiceAccountConfig(t, "ns", "controller")  // as a ServiceAccount
//	env := kubeenv.Start(t, kubeenv.WithAudit("ns"))       // env.AuditLog: ns's ServiceAccounts' requests
//	env := kubeenv.Start(t, kubeenv.WithScheduler(),        // + kube-scheduler, and a serving
//		kubeenv.WithServingIPs(net.ParseIP("10.0.1.1"))) // certificate also for 10.0.1.1
//
// # What runs
//
// Start picks free loopback ports and starts:
//
//   - etcd with its data in t.TempDir() (no fsync: a test cluster need not survive a
//     crash of the machine).
//   - kube-apiserver serving TLS on 127.0.0.1 with a certificate from a CA that Start
//     generates, authorization RBAC only (no AlwaysAllow), a static token for the admin
//     user in group system:masters (--token-auth-file), a service-account signing key that
//     Start generates (so the TokenRequest API issues real tokens), and a service cluster IP
//     range. Start returns once /readyz answers ok and the "default" namespace exists.
//   - with WithControllerManager, kube-controller-manager with the default controllers
//     (PV binder, service accounts, namespaces, garbage collector, ...), without leader
//     election, authenticated as the admin. Start waits for its /healthz.
//   - with WithScheduler, kube-scheduler (no leader election), authenticated as the admin.
//     Start waits for its /healthz.
//
// There is no kubelet here: pods are stored but never run, unless a node joins (test/cluster
// runs a kubelet in the QEMU VM against this control plane).
//
// The binaries come from $RAID10_KUBE_BIN_DIR, which hack/build-tools.sh (make deps) fills
// and hack/tool-env.sh exports. When it is unset or a binary is missing, Start fails the
// test under CI (internal/testenv: CI set to anything but "", 0 or false), and skips it
// otherwise with a message that says to run `make deps`.
//
// # Lifetime and logs
//
// Every process runs in its own process group and is stopped in t.Cleanup: SIGTERM to the
// group, then SIGKILL after a grace period, so nothing outlives the test. Each process
// writes its log to a file under Env.Dir; when the test has failed (or a process does not
// come up), the tail of each log is printed with t.Log.
//
// # Why not controller-runtime's envtest
//
// envtest would drive the same binaries, but it cannot run kube-controller-manager (which
// the PV-binding tests need), authenticates with client certificates instead of the token
// and ServiceAccount flow the tests exercise, and would add sigs.k8s.io/controller-runtime to
// the test dependencies for what is about 400 lines here with client-go only.
package kubeenv
