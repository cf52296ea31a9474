package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/raid10-csi/raid10-csi/pkg/metrics"
)

// prometheusRule is the part of monitoring.coreos.com/v1 PrometheusRule the chart writes;
// decoding with unknown fields refused catches a misspelt or misplaced key.
type prometheusRule struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   map[string]any `json:"metadata"`
	Spec       struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// exportedMetrics maps every metric name the plugin's collectors can export to its labels,
// from their descriptions (no series needed).
func exportedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		metrics.NewPoolCollector(nil).Describe(ch)
		metrics.NewIOCollector(nil).Describe(ch)
		close(ch)
	}()
	name := regexp.MustCompile(`fqName: "([^"]+)"`)
	labels := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	out := map[string][]string{}
	for d := range ch {
		s := d.String()
		m := name.FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("desc without a name: %s", s)
		}
		var ls []string
		if l := labels.FindStringSubmatch(s); l != nil && l[1] != "" {
			ls = strings.Split(l[1], ",")
		}
		out[m[1]] = ls
		if strings.HasSuffix(m[1], "_seconds") || strings.Contains(s, "histogram") {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				out[m[1]+suf] = ls
			}
		}
	}
	return out
}

var (
	promDuration = regexp.MustCompile(`^([0-9]+(ms|s|m|h|d|w|y))+$`)
	alertName    = regexp.MustCompile(`^[A-Z][A-Za-z0-9]*$`)
	// A selector: a metric name and its optional label matchers.
	selector = regexp.MustCompile(`(raid10_[a-z0-9_]+)(\{([^}]*)\})?`)
	matcher  = regexp.MustCompile(`^\s*([a-z_]+)\s*(=|!=|=~|!~)\s*"[^"]*"\s*$`)
)

// TestPrometheusRule renders the chart's PrometheusRule and checks it: absent by default;
// with prometheusRule.enabled, one object of the operator's shape (strict decoding), every
// alert with a severity, a summary and a description, every `for` a Prometheus duration,
// every expression balanced and naming only metrics and labels the plugin exports, and
// every alert named in docs/operations.md (so the two lists stay one).
func TestPrometheusRule(t *testing.T) {
	bin := helmBinary(t)
	if objs := renderChart(t, bin); find(objs, "PrometheusRule", "raid10-csi") != nil {
		t.Fatal("a PrometheusRule with the defaults: it must be off unless enabled")
	}
	exported := exportedMetrics(t)
	docs, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		set    []string
		alerts int
	}{
		{"Enabled", []string{"--set", "prometheusRule.enabled=true"}, 10},
		{"WithCapacityAndLabels", []string{"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.largestVolumeBelowBytes=107374182400",
			"--set", "prometheusRule.labels.release=kube-prometheus-stack", "--set", "prometheusRule.degradedFor=1h"}, 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := renderChart(t, bin, tc.set...)
			u := find(objs, "PrometheusRule", "raid10-csi")
			if u == nil {
				t.Fatalf("no PrometheusRule in %v", kindsOf(objs))
			}
			if u.GetNamespace() != namespace {
				t.Errorf("namespace %q, want %q", u.GetNamespace(), namespace)
			}
			raw, err := json.Marshal(u.Object)
			if err != nil {
				t.Fatal(err)
			}
			var pr prometheusRule
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&pr); err != nil {
				t.Fatalf("PrometheusRule does not decode strictly: %v", err)
			}
			if pr.APIVersion != "monitoring.coreos.com/v1" || len(pr.Spec.Groups) != 1 {
				t.Fatalf("apiVersion %q, %d groups", pr.APIVersion, len(pr.Spec.Groups))
			}
			if slices.Contains(tc.set, "prometheusRule.labels.release=kube-prometheus-stack") && u.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Errorf("labels %v lack the extra label", u.GetLabels())
			}
			rules := pr.Spec.Groups[0].Rules
			if len(rules) != tc.alerts {
				t.Fatalf("%d alerts, want %d", len(rules), tc.alerts)
			}
			seen := map[string]bool{}
			for _, r := range rules {
				if !alertName.MatchString(r.Alert) || seen[r.Alert] {
					t.Errorf("alert name %q: not CamelCase or twice", r.Alert)
				}
				seen[r.Alert] = true
				if r.For != "" && !promDuration.MatchString(r.For) {
					t.Errorf("%s: for %q is not a Prometheus duration", r.Alert, r.For)
				}
				if s := r.Labels["severity"]; s != "critical" && s != "warning" {
					t.Errorf("%s: severity %q", r.Alert, s)
				}
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Errorf("%s: summary or description missing", r.Alert)
				}
				if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "[") != strings.Count(r.Expr, "]") ||
					strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
					t.Errorf("%s: unbalanced expression %q", r.Alert, r.Expr)
				}
				sels := selector.FindAllStringSubmatch(r.Expr, -1)
				if len(sels) == 0 {
					t.Errorf("%s: expression %q names no raid10_ metric", r.Alert, r.Expr)
				}
				for _, sel := range sels {
					labels, ok := exported[sel[1]]
					if !ok {
						t.Errorf("%s: metric %s is not exported by pkg/metrics", r.Alert, sel[1])
						continue
					}
					for _, m := range strings.Split(sel[3], ",") {
						if strings.TrimSpace(m) == "" {
							continue
						}
						mm := matcher.FindStringSubmatch(m)
						if mm == nil || !slices.Contains(labels, mm[1]) {
							t.Errorf("%s: matcher %q: not a label of %s %v", r.Alert, m, sel[1], labels)
						}
					}
				}
				if !bytes.Contains(docs, []byte("`"+r.Alert+"`")) {
					t.Errorf("%s is not in docs/operations.md", r.Alert)
				}
			}
		})
	}
}

// TestPrometheusRuleSchema: values.schema.json refuses bad prometheusRule values.
func TestPrometheusRuleSchema(t *testing.T) {
	bin := helmBinary(t)
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"Duration", []string{"--set", "prometheusRule.degradedFor=soon"}, "/prometheusRule/degradedFor"},
		{"GoDuration", []string{"--set", "prometheusRule.rebuildingFor=1h30m0.5s"}, "/prometheusRule/rebuildingFor"},
		{"NegativeBytes", []string{"--set", "prometheusRule.largestVolumeBelowBytes=-1"}, "/prometheusRule/largestVolumeBelowBytes"},
		{"UnknownKey", []string{"--set", "prometheusRule.severity=page"}, "/prometheusRule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"template", "raid10-csi", chartDir, "--kube-version", kubeVersion}, tc.set...)
			_, stderr, err := helm(t, bin, args...)
			if err == nil {
				t.Fatalf("helm template %v succeeded; the schema should refuse it", tc.set)
			}
			if !strings.Contains(stderr, "at '"+tc.want) {
				t.Fatalf("helm template %v: error does not name %s:\n%s", tc.set, tc.want, stderr)
			}
		})
	}
}
