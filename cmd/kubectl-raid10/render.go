package main

// Rendering: what both modes print, as tables, JSON or YAML (-o). This file holds the parts
// every table shares; render_local.go prints pool.Status and its parts, render_cluster.go
// and render_describe.go the custom resources, progress.go every percentage and bar.

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/raid10-csi/raid10-csi/pkg/apis/raid10/v1alpha1"
)

// renderer prints results as tables, JSON or YAML, as o.Output asks.
type renderer struct {
	o *Options
	w io.Writer
}

// structured writes v as JSON or YAML (-o), reporting whether it did; with -o table it
// writes nothing and the caller prints its table.
func (r renderer) structured(v any) (bool, error) {
	switch r.o.Output {
	case "json":
		e := json.NewEncoder(r.w)
		e.SetIndent("", "  ")
		return true, e.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = r.w.Write(b)
		return true, err
	}
	return false, nil
}

// stream writes one item of a sequence as it comes (wait, scrub and their --follow): one
// JSON object a line, one YAML document each, or line as it is.
func (r renderer) stream(v any, line string) error {
	switch r.o.Output {
	case "json":
		return json.NewEncoder(r.w).Encode(v)
	case "yaml":
		if _, err := fmt.Fprintln(r.w, "---"); err != nil {
			return err
		}
		_, err := r.structured(v)
		return err
	}
	_, err := fmt.Fprintln(r.w, line)
	return err
}

// done reports a command that has no result but its success.
func (r renderer) done(msg string) error {
	if ok, err := r.structured(map[string]string{"result": msg}); ok {
		return err
	}
	_, err := fmt.Fprintln(r.w, msg)
	return err
}

// table starts a table of aligned columns on r.w; write its rows through ew, then check
// ew.err and Flush tw.
func (r renderer) table() (tw *tabwriter.Writer, ew *errWriter) {
	tw = tabwriter.NewWriter(r.w, 0, 4, 2, ' ', 0)
	return tw, &errWriter{w: tw}
}

// flush ends a table started by table: the first write error, else the flush's.
func flush(tw *tabwriter.Writer, ew *errWriter) error {
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

// errWriter keeps the first write error, so a table is written without a check per line.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

// listOf wraps items as a Kubernetes List, as kubectl get -o json prints them.
func listOf[T any](kind string, items []T) map[string]any {
	if items == nil {
		items = []T{}
	}
	return map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind, "items": items}
}

// human formats bytes in binary units.
func human(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	v := float64(b) / float64(div)
	if v == float64(uint64(v)) {
		return fmt.Sprintf("%d%ciB", uint64(v), "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f%ciB", v, "KMGTPE"[exp])
}

// short is a UUID's first 8 digits, "-" for none.
func short(u string) string {
	if len(u) >= 8 {
		return u[:8]
	}
	if u == "" {
		return "-"
	}
	return u
}

// dash shows an empty field as "-".
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// blocks shows a volume's bad block count with the lost ones: "0", "12", "12 (3 lost)".
func blocks(bad, lost int64) string {
	if lost > 0 {
		return fmt.Sprintf("%d (%d lost)", bad, lost)
	}
	return strconv.FormatInt(bad, 10)
}

// age is how long ago t was, as kubectl shows ages ("5m", "3h"); "-" for none.
func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}
