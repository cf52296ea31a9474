// Package testenv decides, in one place, what a test does when it cannot run here.
//
// Two kinds of "cannot run" exist and they are kept apart:
//
//   - Something the test needs is missing on this machine (a tool, root, a loop device, the
//     VM harness, a control-plane binary). Missing and the Require* helpers skip the test on
//     a developer's machine and FAIL it under CI: a CI run that lacks a tool is a broken CI
//     run, never a green one.
//   - The test is left out by design: it is the other half of a host/VM pair (KindGuest),
//     or the run asked for the fast tests only with -short or RAID10_SKIP_HEAVY (KindHeavy,
//     `make unit`), or it runs only when another test drives it (KindDriven). Skip skips
//     with the kind in the message.
//
// Every skip message starts with its kind in brackets, e.g. "[guest] runs in the VM
// (TestKernelVM)". hack/test.sh fails a CI run on any skip that hack/skips.txt does not list
// with that package, test name and kind (hack/skipcheck), so a skip cannot creep in silently.
//
// The CI rule: CI is on when the environment variable CI is set to anything but "", "0" or
// "false" (case-insensitive). .ci/run exports CI=true; most CI systems set CI=true or CI=1.
package testenv
