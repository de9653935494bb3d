package config_test

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/dedupworker/internal/config"
)

// referencePage is the configuration reference users read.
const referencePage = "../../docs/CONFIGURATION.md"

// sharedBlocks are the struct types that appear at many places of the file
// with the same fields. The reference describes their fields once, under the
// block's name ("tls.ca_file"), and each place that takes one as a row of its
// own ("redis.tls").
var sharedBlocks = map[reflect.Type]string{
	reflect.TypeFor[config.TLS]():  "tls",
	reflect.TypeFor[config.SASL](): "sasl",
}

// TestConfigurationReference keeps docs/CONFIGURATION.md and the config
// structs in step: every YAML field, found by walking the yaml tags from
// [config.Config], has a row in the reference, and every row names a field
// that exists.
func TestConfigurationReference(t *testing.T) {
	want := map[string]bool{}
	walkYAML(reflect.TypeFor[config.Config](), "", want)
	for typ, name := range sharedBlocks {
		walkYAML(typ, name, want)
	}

	page, err := os.ReadFile(referencePage)
	if err != nil {
		t.Fatal(err)
	}
	documented := referenceRows(string(page))
	if len(documented) == 0 {
		t.Fatalf("%s: no reference rows found (a table row that starts with | `field.path` |)", referencePage)
	}

	var missing, unknown []string
	for path := range want {
		if !documented[path] {
			missing = append(missing, path)
		}
	}
	for path := range documented {
		if !want[path] {
			unknown = append(unknown, path)
		}
	}
	slices.Sort(missing)
	slices.Sort(unknown)
	for _, p := range missing {
		t.Errorf("%s has no row for the config field %q: add | `%s` | type | default | meaning |", referencePage, p, p)
	}
	for _, p := range unknown {
		t.Errorf("%s documents %q, which is no field of internal/config: remove the row or fix its path", referencePage, p)
	}
}

// walkYAML adds the YAML path of every field of the struct type t, under
// prefix, to paths. A field of a struct type adds its own path and, unless
// its type is a shared block, its fields'; a list of structs adds "[]".
// Fields inlined with ",inline" belong to their parent.
func walkYAML(t reflect.Type, prefix string, paths map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		ft := f.Type
		if opts == "inline" {
			walkYAML(ft, prefix, paths)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		paths[path] = true
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			walkYAML(ft.Elem(), path+"[]", paths)
			continue
		}
		if ft.Kind() != reflect.Struct {
			continue
		}
		if _, shared := sharedBlocks[ft]; shared {
			continue
		}
		if ft.NumField() > 0 && ft.Field(0).Tag.Get("yaml") != "" {
			walkYAML(ft, path, paths)
		}
	}
}

var referenceRow = regexp.MustCompile("(?m)^\\| `([a-z_.\\[\\]]+)` \\|")

// referenceRows returns the field paths the page's table rows start with.
func referenceRows(page string) map[string]bool {
	rows := map[string]bool{}
	for _, m := range referenceRow.FindAllStringSubmatch(page, -1) {
		rows[m[1]] = true
	}
	return rows
}
