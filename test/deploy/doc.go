// Package deploy tests the rendered manifests in deploy/ (the chart with its default values)
// against a real kube-apiserver: every object is accepted, and the ServiceAccounts get what
// their containers need and nothing more.
package deploy
