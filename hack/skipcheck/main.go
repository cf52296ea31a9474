// Command skipcheck reads the output of `go test -v` over one or more packages (hack/test.sh's
// _output/test.log) and lists every skipped test with its package, its kind (the
// "[kind]" that internal/testenv puts at the start of a skip message) and its reason. It
// exits 1 when a skip is not allowed by the allow-list (hack/skips.txt): always with
// -fail, and by default under CI (internal/testenv's rule). A CI run must not pass because
// a test skipped that nobody agreed may skip.
//
//	go run ./hack/skipcheck [-allow hack/skips.txt] [-fail] _output/test.log
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/raid10-csi/raid10-csi/internal/testenv"
)

// Skip is one skipped test or subtest found in the log.
type Skip struct {
	Package string // module-relative ("pkg/nbd"), or the import path outside the module
	Test    string // "TestX" or "TestX/sub"
	Kind    string // from the "[kind]" tag of the message; "" when the message has none
	Message string // the skip message as logged, without the file:line prefix
}

// Rule is one line of the allow-list.
type Rule struct {
	Package string
	Pattern string // the test regexp as written
	Test    *regexp.Regexp
	Kind    string
	Reason  string
	Line    int
	used    int
}

var kinds = map[string]bool{
	string(testenv.KindGuest): true, string(testenv.KindHeavy): true, string(testenv.KindDriven): true,
}

// ParseAllow reads an allow-list: "package test-regexp kind reason...", # comments.
func ParseAllow(r io.Reader) ([]*Rule, error) {
	var rules []*Rule
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 {
			return nil, fmt.Errorf("line %d: want package, test regexp, kind and a reason: %q", n, line)
		}
		if !kinds[f[2]] {
			return nil, fmt.Errorf("line %d: kind %q cannot be allowed (guest, heavy or driven; a missing tool fails under CI)", n, f[2])
		}
		re, err := regexp.Compile("^(?:" + f[1] + ")$")
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rules = append(rules, &Rule{Package: f[0], Pattern: f[1], Test: re, Kind: f[2], Reason: strings.Join(f[3:], " "), Line: n})
	}
	return rules, sc.Err()
}

var (
	header  = regexp.MustCompile(`^=== (?:RUN|CONT|NAME|PAUSE)\s+(\S+)`)
	logLine = regexp.MustCompile(`^\s+\S+\.go:\d+: (.*)$`)
	skipRe  = regexp.MustCompile(`^\s*--- SKIP: (\S+) \(`)
	result  = regexp.MustCompile(`^\s*--- (?:PASS|FAIL): `)
	summary = regexp.MustCompile(`^(?:ok|FAIL)\s+(\S+)(?:\s|$)`)
	tag     = regexp.MustCompile(`^\[([a-z]+)\] `)
)

// ParseLog returns the skips of a `go test -v` log, in order. module is stripped from the
// package paths. A package's tests are those printed before its "ok"/"FAIL" line (go test
// prints each package's output in one piece).
func ParseLog(r io.Reader, module string) ([]Skip, error) {
	var (
		all, pending []Skip
		current      string
		last         = map[string]string{} // test -> its latest logged message
		await        = -1                  // index in pending of a skip still without a message
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Text()
		if m := skipRe.FindStringSubmatch(line); m != nil {
			s := Skip{Test: m[1], Message: last[m[1]]}
			pending = append(pending, s)
			await = -1
			if s.Message == "" {
				await = len(pending) - 1 // non-chatty output prints the message after
			}
			continue
		}
		if m := header.FindStringSubmatch(line); m != nil {
			current, await = m[1], -1
			continue
		}
		if m := logLine.FindStringSubmatch(line); m != nil {
			if await >= 0 {
				pending[await].Message = m[1]
				await = -1
			} else if current != "" {
				last[current] = m[1]
			}
			continue
		}
		if result.MatchString(line) {
			await = -1
			continue
		}
		if m := summary.FindStringSubmatch(line); m != nil {
			pkg := strings.TrimPrefix(strings.TrimPrefix(m[1], module), "/")
			if pkg == "" {
				pkg = "."
			}
			for _, s := range pending {
				s.Package = pkg
				all = append(all, s)
			}
			pending, current, await = nil, "", -1
			clear(last)
		}
	}
	for _, s := range pending { // a log cut short: the package is unknown
		s.Package = "?"
		all = append(all, s)
	}
	for i := range all {
		if m := tag.FindStringSubmatch(all[i].Message); m != nil {
			all[i].Kind = m[1]
		}
	}
	return all, sc.Err()
}

// Allowed returns the rule that allows s, or nil.
func Allowed(rules []*Rule, s Skip) *Rule {
	for _, r := range rules {
		if r.Package == s.Package && r.Kind == s.Kind && r.Test.MatchString(s.Test) {
			return r
		}
	}
	return nil
}

// printer writes formatted lines to w and keeps the first write error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

// Check writes the report to w and returns the skips no rule allows.
func Check(w io.Writer, rules []*Rule, skips []Skip) []Skip {
	var bad []Skip
	for _, s := range skips {
		if r := Allowed(rules, s); r != nil {
			r.used++
			continue
		}
		bad = append(bad, s)
	}
	p := &printer{w: w}
	p.printf("skipcheck: %d skipped, %d allowed by the allow-list, %d not allowed\n", len(skips), len(skips)-len(bad), len(bad))
	for _, r := range rules {
		if r.used > 0 {
			p.printf("  allowed %3d  %s %s [%s]: %s\n", r.used, r.Package, r.Pattern, r.Kind, r.Reason)
		}
	}
	if len(bad) > 0 {
		p.printf("skipcheck: UNEXPECTED SKIPS (not in the allow-list; a test that must run here did not):\n")
		for _, s := range bad {
			note := ""
			if s.Kind == "" {
				note = " (no [kind]: skipped without internal/testenv)"
			}
			p.printf("  --- SKIP: %s in %s: %s%s\n", s.Test, s.Package, s.Message, note)
		}
	}
	return bad
}

// modulePath returns the module path from ./go.mod, or "".
func modulePath() string {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "module" {
			return f[1]
		}
	}
	return ""
}

func main() {
	allow := flag.String("allow", "hack/skips.txt", "the allow-list")
	fail := flag.Bool("fail", testenv.CI(), "exit 1 on a skip that is not allowed (default: under CI)")
	module := flag.String("module", modulePath(), "module path stripped from package paths")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: skipcheck [-allow FILE] [-fail] LOG")
		os.Exit(2)
	}
	os.Exit(run(*allow, flag.Arg(0), *module, *fail, os.Stdout))
}

// run checks the log against the allow-list, writes the report to w and returns the exit
// status: 0, 1 for a skip not allowed when fail is set, 2 when a file cannot be read.
func run(allowPath, logPath, module string, fail bool, w io.Writer) int {
	p := &printer{w: w}
	allow, err := os.ReadFile(allowPath)
	if err != nil {
		p.printf("skipcheck: %v\n", err)
		return 2
	}
	rules, err := ParseAllow(bytes.NewReader(allow))
	if err != nil {
		p.printf("skipcheck: %s: %v\n", allowPath, err)
		return 2
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		p.printf("skipcheck: %v\n", err)
		return 2
	}
	skips, err := ParseLog(bytes.NewReader(log), module)
	if err != nil {
		p.printf("skipcheck: %s: %v\n", logPath, err)
		return 2
	}
	if bad := Check(w, rules, skips); len(bad) > 0 && fail {
		p.printf("skipcheck: FAIL: %d unexpected skips under CI; fix the test or its environment, or add a line with the reason to %s\n", len(bad), allowPath)
		return 1
	}
	return 0
}
