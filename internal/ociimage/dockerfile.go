package ociimage

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// ErrDockerfile is wrapped by every error about the Dockerfile's content.
var ErrDockerfile = errors.New("ociimage: Dockerfile")

// Dockerfile is what the image builder takes from a Dockerfile's final stage.
type Dockerfile struct {
	// Base is the final stage's FROM image, e.g. debian:bookworm-slim.
	Base string
	// Suite is the Debian suite of Base, e.g. bookworm.
	Suite string
	// Packages are the Debian packages the final stage's `apt-get install` lines add, in
	// order.
	Packages []string
	// Files are the absolute paths the final stage's COPY lines create, in order, each with
	// the base name of its source (the file to put there).
	Files []File
	// Entrypoint is the exec-form ENTRYPOINT.
	Entrypoint []string
}

// File is one file a COPY puts in the image.
type File struct {
	// Path in the image, absolute.
	Path string
	// Source is the COPY source's base name: the name of the binary to put at Path.
	Source string
}

// ParseDockerfile reads the instructions of r (continued lines joined, comments dropped)
// and returns its final stage. Understood there: FROM debian:<suite>[-slim], RUN (only its
// `apt-get install` packages matter; RUN lines change nothing else the builder makes),
// COPY (without --chown/--chmod) and ENTRYPOINT in exec form. Anything else in the final
// stage is an error wrapping ErrDockerfile, naming the line.
func ParseDockerfile(r io.Reader) (*Dockerfile, error) {
	type instr struct {
		line int
		cmd  string
		args string
	}
	var instrs []instr
	sc := bufio.NewScanner(r)
	var cur strings.Builder
	start, n := 0, 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(line)
		full := cur.String()
		cur.Reset()
		cmd, args, _ := strings.Cut(full, " ")
		instrs = append(instrs, instr{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("%w: the last instruction ends in a line continuation", ErrDockerfile)
	}
	last := -1
	for i, in := range instrs {
		if in.cmd == "FROM" {
			last = i
		}
	}
	if last < 0 {
		return nil, fmt.Errorf("%w: no FROM", ErrDockerfile)
	}
	df := &Dockerfile{}
	for _, in := range instrs[last:] {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: line %d (%s): %s", ErrDockerfile, in.line, in.cmd, fmt.Sprintf(format, a...))
		}
		switch in.cmd {
		case "FROM":
			f := strings.Fields(in.args)
			if len(f) == 0 {
				return nil, bad("no image")
			}
			df.Base = f[0]
			repo, tag, _ := strings.Cut(df.Base, ":")
			if repo != "debian" && repo != "docker.io/library/debian" || tag == "" {
				return nil, bad("base %q: the image builder makes Debian root filesystems only (debian:<suite> or debian:<suite>-slim)", df.Base)
			}
			df.Suite = strings.TrimSuffix(tag, "-slim")
		case "RUN":
			df.Packages = append(df.Packages, aptPackages(in.args)...)
		case "COPY":
			f := strings.Fields(in.args)
			var srcs []string
			for _, a := range f[:max(len(f)-1, 0)] {
				switch {
				case strings.HasPrefix(a, "--from="):
				case strings.HasPrefix(a, "--"):
					return nil, bad("option %s is not supported by the image builder", a)
				default:
					srcs = append(srcs, a)
				}
			}
			if len(srcs) == 0 {
				return nil, bad("needs a source and a destination")
			}
			dest := f[len(f)-1]
			if !path.IsAbs(dest) {
				return nil, bad("destination %q must be absolute", dest)
			}
			if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
				return nil, bad("destination %q of several sources must end in /", dest)
			}
			for _, s := range srcs {
				p := dest
				if strings.HasSuffix(dest, "/") {
					p = path.Join(dest, path.Base(s))
				}
				df.Files = append(df.Files, File{Path: path.Clean(p), Source: path.Base(s)})
			}
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &df.Entrypoint); err != nil || len(df.Entrypoint) == 0 {
				return nil, bad("must be a non-empty exec form [\"/path\", ...]: %q", in.args)
			}
		default:
			return nil, bad("not supported in the final stage by the image builder (internal/ociimage)")
		}
	}
	if df.Entrypoint == nil {
		return nil, fmt.Errorf("%w: the final stage has no ENTRYPOINT", ErrDockerfile)
	}
	return df, nil
}

// aptPackages returns the package arguments of every `apt-get install` in a RUN command.
func aptPackages(run string) []string {
	var pkgs []string
	for _, part := range strings.FieldsFunc(run, func(r rune) bool { return r == '&' || r == ';' || r == '|' }) {
		f := strings.Fields(part)
		if len(f) < 2 || f[0] != "apt-get" {
			continue
		}
		install := false
		for _, a := range f[1:] {
			switch {
			case a == "install":
				install = true
			case strings.HasPrefix(a, "-"):
			case install:
				pkgs = append(pkgs, a)
			}
		}
	}
	return pkgs
}
