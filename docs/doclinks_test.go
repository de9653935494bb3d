package docs_test

import (
	"go/ast"
	"go/doc"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// bracketName is a doc link as written: [Name], [Name.Field], [pkg.Name],
// after a space or punctuation and before one, as go/doc requires (so
// m[i] and map[string]T are not links).
var bracketName = regexp.MustCompile(`(?:^|[\s(,;:"'])\[\*?([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\](?:$|[\s.,;:)"'])`)

// TestGoDocLinks: every [Name] doc link in the module's Go doc comments
// resolves through go/doc, so a renamed or removed name is caught. A link
// that does not resolve stays plain text in the parsed comment, which is what
// this looks for.
func TestGoDocLinks(t *testing.T) {
	for _, dir := range packageDirs(t) {
		fset := token.NewFileSet()
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		pkgs := map[string][]*ast.File{}
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
		}
		for pkgName, files := range pkgs {
			p, err := doc.NewFromFiles(fset, files, "example.com/"+pkgName)
			if err != nil {
				t.Fatal(err)
			}
			check := func(where, text string) {
				if text == "" {
					return
				}
				for _, name := range unresolvedLinks(p.Parser().Parse(text)) {
					t.Errorf("%s: %s: the doc link [%s] resolves to nothing: name an exported identifier of the package or of one it imports", dir, where, name)
				}
			}
			check("package doc", p.Doc)
			for _, c := range p.Consts {
				check("const", c.Doc)
			}
			for _, v := range p.Vars {
				check("var", v.Doc)
			}
			for _, f := range p.Funcs {
				check(f.Name, f.Doc)
			}
			for _, typ := range p.Types {
				check(typ.Name, typ.Doc)
				for _, f := range typ.Funcs {
					check(f.Name, f.Doc)
				}
				for _, m := range typ.Methods {
					check(typ.Name+"."+m.Name, m.Doc)
				}
			}
		}
	}
}

// unresolvedLinks returns the bracketed names left as plain text in d.
func unresolvedLinks(d *comment.Doc) []string {
	var names []string
	var walk func(texts []comment.Text)
	walk = func(texts []comment.Text) {
		for _, x := range texts {
			switch x := x.(type) {
			case comment.Plain:
				for _, m := range bracketName.FindAllStringSubmatch(string(x), -1) {
					names = append(names, m[1])
				}
			case *comment.Link:
				walk(x.Text)
			case *comment.DocLink:
				// resolved
			}
		}
	}
	for _, b := range d.Content {
		switch b := b.(type) {
		case *comment.Paragraph:
			walk(b.Text)
		case *comment.Heading:
			walk(b.Text)
		case *comment.List:
			for _, it := range b.Items {
				for _, c := range it.Content {
					if p, ok := c.(*comment.Paragraph); ok {
						walk(p.Text)
					}
				}
			}
		}
	}
	return names
}

// packageDirs lists the directories of this module that hold Go files,
// leaving out testdata and nested modules.
func packageDirs(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if p != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if p != root {
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		matches, _ := filepath.Glob(filepath.Join(p, "*.go"))
		for _, m := range matches {
			if !strings.HasSuffix(m, "_test.go") {
				dirs = append(dirs, p)
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no Go package found under " + root)
	}
	return dirs
}
