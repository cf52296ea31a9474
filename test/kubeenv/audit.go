package kubeenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WithAudit turns on kube-apiserver's audit log for the requests of the ServiceAccounts in
// the given namespaces (users system:serviceaccount:<namespace>:*, matched by their group
// system:serviceaccounts:<namespace>), at level Metadata: who, verb, resource, subresource,
// namespace, name and response code, no bodies. Every other request is not logged. Events
// are written as JSON lines to Env.AuditLog, synchronously (the log backend's blocking
// mode): a request the server has answered is in the file. The stage RequestReceived is
// omitted; a watch logs ResponseStarted when it begins and ResponseComplete when it ends.
func WithAudit(namespaces ...string) Option {
	return func(o *options) { o.auditNamespaces = append(o.auditNamespaces, namespaces...) }
}

// auditPolicy returns the audit.k8s.io/v1 Policy of WithAudit.
func auditPolicy(namespaces []string) string {
	groups := make([]string, len(namespaces))
	for i, ns := range namespaces {
		groups[i] = fmt.Sprintf("%q", "system:serviceaccounts:"+ns)
	}
	return `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [` + strings.Join(groups, ", ") + `]
  - level: None
`
}

// auditFlags writes the policy of WithAudit under dir and returns kube-apiserver's flags
// for it and the path of the log.
func auditFlags(dir string, namespaces []string) (flags []string, logPath string, err error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy(namespaces)), 0o600); err != nil {
		return nil, "", fmt.Errorf("kubeenv: audit policy: %w", err)
	}
	logPath = filepath.Join(dir, "audit.log")
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + logPath,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		"--audit-log-maxsize=0", // no rotation: one file for the whole test
	}, logPath, nil
}
