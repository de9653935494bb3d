// Package docs_test checks that the repository's documentation refers only to
// what the repository holds: no reference to a design document outside it,
// no relative Markdown link to a missing file or heading, no mention of a
// docs page that does not exist, and a README whose library program is the
// one under examples/ that the build compiles.
package docs_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository's top directory, seen from this package.
const root = ".."

// externalRef matches a reference to the design document the project was
// built from, which the repository does not hold. It is spelled with a
// character class so that this file does not match itself.
var externalRef = regexp.MustCompile(`\bS[P]EC\b`)

// trackedFiles lists the repository's tracked files, relative to root.
func trackedFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		// CI runs in a clone: there, a failing git is an error, not a skip.
		if os.Getenv("DEDUP_REQUIRE_SERVICES") == "1" {
			t.Fatalf("git ls-files (DEDUP_REQUIRE_SERVICES=1): %v", err)
		}
		t.Skipf("not a git checkout (git ls-files: %v): nothing to check", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		t.Fatal("git ls-files listed no file")
	}
	return files
}

// readText returns a tracked file's text, or ok false for a binary file or
// one deleted from the work tree.
func readText(t *testing.T, name string) (string, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
	if os.IsNotExist(err) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return "", false
	}
	return string(b), true
}

func TestNoExternalDesignReferences(t *testing.T) {
	for _, f := range trackedFiles(t) {
		text, ok := readText(t, f)
		if !ok {
			continue
		}
		for i, line := range strings.Split(text, "\n") {
			if externalRef.MatchString(line) {
				t.Errorf("%s:%d refers to a design document the repository lacks: state the fact, or link the docs/ page that does: %s",
					f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

var (
	mdLink   = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)
	fence    = regexp.MustCompile("^\\s*(```|~~~)")
	heading  = regexp.MustCompile(`^(#{1,6})\s+(.+?)\s*#*\s*$`)
	docsPage = regexp.MustCompile(`\bdocs/([A-Za-z0-9_-]+\.md)(?:, "([^"]+)"| "([^"]+)")?`)
)

// anchors returns the heading anchors of a Markdown text as GitHub makes
// them: lower case, punctuation other than '-' and '_' dropped, spaces to
// '-', and "-1", "-2" ... after repeats.
func anchors(text string) map[string]bool {
	set := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(text) {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			set[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			set[a] = true
		}
		seen[a]++
	}
	return set
}

func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines returns the lines of a Markdown text outside fenced code blocks.
func proseLines(text string) []string {
	var lines []string
	in := false
	for _, line := range strings.Split(text, "\n") {
		if fence.MatchString(line) {
			in = !in
			continue
		}
		if !in {
			lines = append(lines, line)
		}
	}
	return lines
}

// repoTree is the set of tracked files and of the directories holding them.
func repoTree(files []string) map[string]bool {
	tree := map[string]bool{".": true}
	for _, f := range files {
		tree[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			tree[d] = true
		}
	}
	return tree
}

// TestMarkdownLinks: every relative link of a tracked Markdown file names a
// file or directory of the repository, and a heading the target has.
func TestMarkdownLinks(t *testing.T) {
	files := trackedFiles(t)
	tree := repoTree(files)
	for _, f := range files {
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		text, ok := readText(t, f)
		if !ok {
			continue
		}
		for _, line := range proseLines(text) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := f
				if file != "" {
					dest = path.Clean(path.Join(path.Dir(f), file))
				}
				if !tree[dest] {
					t.Errorf("%s links %q: the repository has no %s", f, target, dest)
					continue
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s links %q: only Markdown targets have headings", f, target)
					continue
				}
				dt, _ := readText(t, dest)
				if !anchors(dt)[anchor] {
					t.Errorf("%s links %q: %s has no heading with anchor #%s", f, target, dest, anchor)
				}
			}
		}
	}
}

// TestDocsPageMentions: a mention of docs/<page>.md in any tracked file (code
// comments, scripts, charts) names a page that exists, and a heading quoted
// after it (docs/<page>.md, "Heading") is one of the page's headings.
func TestDocsPageMentions(t *testing.T) {
	files := trackedFiles(t)
	tree := repoTree(files)
	for _, f := range files {
		text, ok := readText(t, f)
		if !ok {
			continue
		}
		for i, line := range strings.Split(text, "\n") {
			for _, m := range docsPage.FindAllStringSubmatch(line, -1) {
				page := "docs/" + m[1]
				if !tree[page] {
					t.Errorf("%s:%d mentions %s, which the repository lacks", f, i+1, page)
					continue
				}
				h := m[2] + m[3]
				if h == "" {
					continue
				}
				pt, _ := readText(t, page)
				if !anchors(pt)[slug(h)] {
					t.Errorf("%s:%d mentions %s, %q: the page has no such heading", f, i+1, page, h)
				}
			}
		}
	}
}

// readmeProgram is the library program of the README: the first Go block,
// which must be examples/nats/main.go as it is, so that what users copy
// compiles.
const readmeProgram = "examples/nats/main.go"

func TestReadmeProgram(t *testing.T) {
	readme, ok := readText(t, "README.md")
	if !ok {
		t.Fatal("no README.md")
	}
	want, ok := readText(t, readmeProgram)
	if !ok {
		t.Fatalf("no %s", readmeProgram)
	}
	start := strings.Index(readme, "\n```go\n")
	if start < 0 {
		t.Fatal("README.md has no ```go block: it must show the library program " + readmeProgram)
	}
	body := readme[start+len("\n```go\n"):]
	end := strings.Index(body, "\n```")
	if end < 0 {
		t.Fatal("README.md: the ```go block is not closed")
	}
	got := body[:end+1]
	if got != want {
		gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
		for i := range max(len(gl), len(wl)) {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("README.md's first Go block differs from %s at its line %d:\nREADME:  %q\nexample: %q\ncopy the file into the README", readmeProgram, i+1, g, w)
			}
		}
	}
}
