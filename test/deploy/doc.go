// Package deploy tests the chart (charts/raid10-csi) and its default rendering (deploy/):
//
//   - TestManifestsApplyAndRBAC: every object of deploy/ is accepted by a real kube-apiserver
//     (CRDs first), and the ServiceAccounts get what their containers need and nothing more.
//     Its NodeChangesOnlyItsOwnObjects plays two node plugins (node ServiceAccount tokens
//     bound to pods on node-a and node-b): each changes its own node's objects, the chart's
//     ValidatingAdmissionPolicy denies it the other's.
//   - TestHelmLint, TestHelmTemplate, TestHelmSchemaRefusesBadValues: helm lint --strict;
//     helm template with the defaults (equal to deploy/), a custom StorageClass, a block of
//     disks (the pool ConfigMap decoded and validated by pkg/pool as the node plugin would),
//     parts switched off; values that break values.schema.json fail and are named.
//   - TestKubeconform: kubeconform -strict over the renderings, with JSON schemas made
//     offline from the real kube-apiserver's /openapi/v2 (built-in kinds and the CRDs), and
//     the same schemas refusing broken manifests.
//
// helm and kubeconform are the pinned builds of hack/csi-tools.sh (built on first use);
// etcd and kube-apiserver come from test/kubeenv. Missing tools skip, or fail under CI (internal/testenv).
package deploy
