package suite

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/version"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	// The external driver: --storage.testdriver=FILE defines the storage testsuites for it.
	_ "k8s.io/kubernetes/test/e2e/storage/external"

	// What the upstream e2e.test registers besides the suites: a node's debug dump on failure,
	// and the node checks the framework runs before each spec.
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
)

// TestMain reads the e2e framework's flags (ginkgo's, the cluster's, --storage.testdriver,
// --list-tests) before any spec runs, as the upstream e2e.test does.
func TestMain(m *testing.M) {
	versionFlag := flag.CommandLine.Bool("version", false, "print the Kubernetes version the suites come from")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *versionFlag {
		fmt.Println(version.Get().GitVersion)
		os.Exit(0)
	}
	if flag.CommandLine.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unknown arguments: %v\n", flag.CommandLine.Args())
		os.Exit(2)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the storage specs selected by --ginkgo.focus/--ginkgo.skip.
func TestE2E(t *testing.T) {
	gomega.RegisterFailHandler(framework.Fail)
	// The framework's configuration: --report-dir gets the JUnit report, timeouts, verbosity.
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "raid10-csi: Kubernetes external storage e2e", suiteConfig, reporterConfig)
}
