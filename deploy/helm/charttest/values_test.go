package charttest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/idemkit/dedupworker/internal/config"
)

// schemaNode is the part of JSON Schema the test walks.
type schemaNode struct {
	Ref                  string                 `json:"$ref"`
	Type                 any                    `json:"type"`
	Properties           map[string]*schemaNode `json:"properties"`
	Items                *schemaNode            `json:"items"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Required             []string               `json:"required"`
}

type schemaDoc struct {
	Schema      string                 `json:"$schema"`
	Definitions map[string]*schemaNode `json:"definitions"`
	schemaNode
}

func loadSchema(t *testing.T) schemaDoc {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s schemaDoc
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	if s.Schema != "http://json-schema.org/draft-07/schema#" {
		t.Errorf("$schema %q, want draft-07", s.Schema)
	}
	return s
}

func (s schemaDoc) resolve(t *testing.T, n *schemaNode) *schemaNode {
	t.Helper()
	for n != nil && n.Ref != "" {
		name, ok := strings.CutPrefix(n.Ref, "#/definitions/")
		if !ok || s.Definitions[name] == nil {
			t.Fatalf("unresolvable $ref %q", n.Ref)
		}
		n = s.Definitions[name]
	}
	return n
}

var (
	durationType = reflect.TypeFor[config.Duration]()
	secretType   = reflect.TypeFor[config.Secret]()
)

// TestSchemaMatchesConfig: the schema of `config` has exactly the fields of
// the binary's config types at every level, and rejects others,
// so values map one-to-one onto the config and a misspelt field fails at
// helm time.
func TestSchemaMatchesConfig(t *testing.T) {
	s := loadSchema(t)
	if s.AdditionalProperties != false {
		t.Error("the values schema allows unknown top-level values")
	}
	cfg := s.Properties["config"]
	if cfg == nil {
		t.Fatal("no config in the values schema")
	}
	compareSchema(t, s, "config", cfg, reflect.TypeFor[config.Config]())
}

func compareSchema(t *testing.T, s schemaDoc, path string, n *schemaNode, typ reflect.Type) {
	t.Helper()
	n = s.resolve(t, n)
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case typ == durationType, typ == secretType, typ.Kind() == reflect.String:
		if n.Type != "string" {
			t.Errorf("%s: schema type %v, want string", path, n.Type)
		}
	case typ.Kind() == reflect.Slice:
		if n.Type != "array" || n.Items == nil {
			t.Errorf("%s: schema type %v, want an array with items", path, n.Type)
			return
		}
		compareSchema(t, s, path+"[]", n.Items, typ.Elem())
	case typ.Kind() == reflect.Map:
		if n.Type != "object" || n.AdditionalProperties == nil {
			t.Errorf("%s: want an object with additionalProperties", path)
		}
	case typ.Kind() == reflect.Struct:
		if n.Type != "object" || n.AdditionalProperties != false {
			t.Errorf("%s: schema must be an object with additionalProperties: false", path)
		}
		fields := map[string]reflect.Type{}
		yamlFields(typ, fields)
		for name, ft := range fields {
			sub, ok := n.Properties[name]
			if !ok {
				t.Errorf("%s.%s: a config field the schema does not allow", path, name)
				continue
			}
			compareSchema(t, s, path+"."+name, sub, ft)
		}
		for name := range n.Properties {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s.%s: in the schema but not a config field", path, name)
			}
		}
	case typ.Kind() == reflect.Int, typ.Kind() == reflect.Bool:
		// integer/boolean, or a string for ${VAR} expansion
	default:
		t.Errorf("%s: unhandled type %s", path, typ)
	}
}

// yamlFields maps YAML field names to types, flattening ",inline" structs.
func yamlFields(typ reflect.Type, out map[string]reflect.Type) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			yamlFields(f.Type, out)
			continue
		}
		if name != "" && name != "-" {
			out[name] = f.Type
		}
	}
}

// leafPaths lists the dotted paths of values.yaml down to scalars, empty
// maps and lists.
func leafPaths(prefix string, v any, out *[]string) {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		*out = append(*out, prefix)
		return
	}
	for k, sub := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		leafPaths(p, sub, out)
	}
}

// TestREADMEListsEveryValue: the chart README's table names every value of
// values.yaml, and names none that values.yaml lacks.
func TestREADMEListsEveryValue(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	var paths []string
	leafPaths("", vals, &paths)
	slices.Sort(paths)
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for line := range strings.SplitSeq(string(readme), "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.HasPrefix(strings.TrimSpace(line), "| `") {
			rows[strings.Trim(strings.TrimSpace(cells[1]), "`")] = true
		}
	}
	for _, p := range paths {
		if !rows[p] {
			t.Errorf("README.md has no table row for value %s", p)
		}
	}
	for r := range rows {
		if !slices.Contains(paths, r) {
			t.Errorf("README.md documents %s, which values.yaml does not have", r)
		}
	}
	// Every top-level value is in the schema too.
	s := loadSchema(t)
	for k := range vals {
		if s.Properties[k] == nil {
			t.Errorf("values.schema.json has no property %s", k)
		}
	}
}
