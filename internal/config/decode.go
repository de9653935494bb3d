package config

import (
	"encoding"
	"fmt"
	"log/slog"
	"math"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Error is a configuration error: the field's path, its line, and what is
// wrong with it.
type Error struct {
	Path string // "handlers[0].lease"; empty for the document itself
	Line int    // 1-based; 0 when the field is absent
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Path != "" {
		b.WriteString(e.Path)
	}
	if e.Line > 0 {
		if e.Path != "" {
			b.WriteString(" ")
		}
		b.WriteString("(line " + strconv.Itoa(e.Line) + ")")
	}
	if e.Path != "" || e.Line > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Duration is a time.Duration read as Go's syntax ("300ms", "30s", "24h")
// plus "d" for days ("7d", "1d12h").
type Duration time.Duration

// D returns the duration as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// String renders the duration in the syntax ParseDuration reads.
func (d Duration) String() string {
	td := time.Duration(d)
	if td >= 24*time.Hour && td%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(td/(24*time.Hour)), 10) + "d"
	}
	return td.String()
}

// MarshalYAML writes the duration as text.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

var daysPrefix = regexp.MustCompile(`^(\d+)d`)

// ParseDuration parses Go's duration syntax plus a leading "<n>d" for days.
func ParseDuration(s string) (time.Duration, error) {
	var days time.Duration
	if m := daysPrefix.FindStringSubmatch(s); m != nil {
		n, err := strconv.ParseInt(m[1], 10, 32)
		if err != nil || time.Duration(n) > math.MaxInt64/(24*time.Hour) {
			return 0, fmt.Errorf("%q is too long a duration (at most %dd)", s, math.MaxInt64/(24*time.Hour))
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[len(m[0]):]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (examples: 300ms, 30s, 5m, 24h, 7d)", s)
	}
	if d > math.MaxInt64-days {
		return 0, fmt.Errorf("%dd%s is too long a duration", days/(24*time.Hour), s)
	}
	return days + d, nil
}

// Secret is a string that is never printed: validate --print and logs show
// "<redacted>".
type Secret string

// String hides the value.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "<redacted>"
}

// MarshalYAML hides the value.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// LogValue hides the value from slog (slog.LogValuer: a JSON handler would
// otherwise write the string itself).
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

var (
	durationType = reflect.TypeFor[Duration]()
	envRef       = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}`)
)

// movedFields are fields the config once had, by path, with where their
// setting is written now: a file that still uses one fails with this
// rather than with "unknown field".
var movedFields = map[string]string{
	"redis.master_name": "moved to redis.sentinel.master; write redis.sentinel: {master: ..., addrs: [...]} " +
		"with the Sentinels in its addrs (redis.addrs is for Cluster seeds only), and the Sentinels' own " +
		"username and password, if they have any, in redis.sentinel",
}

// negativeFixes are what to write instead of a negative duration, by path,
// where the library the field goes to reads a negative value as "off": a
// reader of its documentation may try one.
var negativeFixes = map[string]string{
	"redis.completion_linger": "use 0s to turn the linger off",
}

// decoder walks a YAML node tree into Go values, strictly: unknown fields,
// wrong types and bad durations are errors naming the field path and line.
type decoder struct {
	lookupEnv func(string) (string, bool)
	lines     map[string]int // field path -> line, for errors found after decoding
}

func (d *decoder) expand(n *yaml.Node, path string) (string, error) {
	var missing string
	out := envRef.ReplaceAllStringFunc(n.Value, func(ref string) string {
		m := envRef.FindStringSubmatch(ref)
		if v, ok := d.lookupEnv(m[1]); ok && v != "" {
			return v
		}
		if m[2] != "" {
			return m[3]
		}
		if missing == "" {
			missing = m[1]
		}
		return ""
	})
	if missing != "" {
		return "", &Error{Path: path, Line: n.Line, Msg: "environment variable " + missing + " is not set (use ${" + missing + ":-default} for a default)"}
	}
	return out, nil
}

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	d.lines[path] = n.Line
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // leave the zero value
	}
	t := v.Type()
	switch {
	case t == durationType:
		s, err := d.scalar(n, path, "a duration")
		if err != nil {
			return err
		}
		dur, err := ParseDuration(s)
		if err != nil {
			return &Error{Path: path, Line: n.Line, Msg: err.Error()}
		}
		if dur < 0 {
			msg := "duration must not be negative"
			if fix, ok := negativeFixes[path]; ok {
				msg += "; " + fix
			}
			return &Error{Path: path, Line: n.Line, Msg: msg}
		}
		v.SetInt(int64(dur))
		return nil
	case t.Kind() == reflect.Pointer:
		p := reflect.New(t.Elem())
		if err := d.decode(n, p.Elem(), path); err != nil {
			return err
		}
		v.Set(p)
		return nil
	}
	if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok && t.Kind() != reflect.String {
		s, err := d.scalar(n, path, "a string")
		if err != nil {
			return err
		}
		if err := u.UnmarshalText([]byte(s)); err != nil {
			return &Error{Path: path, Line: n.Line, Msg: err.Error()}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		return d.decodeStruct(n, v, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return &Error{Path: path, Line: n.Line, Msg: "want a list, got " + kindName(n)}
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, c := range n.Content {
			if err := d.decode(c, s.Index(i), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return &Error{Path: path, Line: n.Line, Msg: "want a mapping, got " + kindName(n)}
		}
		m := reflect.MakeMapWithSize(t, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			ev := reflect.New(t.Elem()).Elem()
			if err := d.decode(n.Content[i+1], ev, path+"."+k); err != nil {
				return err
			}
			m.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), ev)
		}
		v.Set(m)
		return nil
	case reflect.String:
		s, err := d.scalar(n, path, "a string")
		if err != nil {
			return err
		}
		v.SetString(s)
		return nil
	case reflect.Bool:
		s, err := d.scalar(n, path, "true or false")
		if err != nil {
			return err
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			return &Error{Path: path, Line: n.Line, Msg: fmt.Sprintf("%q: want true or false", s)}
		}
		v.SetBool(b)
		return nil
	case reflect.Int, reflect.Int32, reflect.Int64:
		s, err := d.scalar(n, path, "an integer")
		if err != nil {
			return err
		}
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v.OverflowInt(i) {
			return &Error{Path: path, Line: n.Line, Msg: fmt.Sprintf("%q: want an integer", s)}
		}
		v.SetInt(i)
		return nil
	}
	return &Error{Path: path, Line: n.Line, Msg: "unsupported field type " + t.String()}
}

func (d *decoder) scalar(n *yaml.Node, path, want string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", &Error{Path: path, Line: n.Line, Msg: "want " + want + ", got " + kindName(n)}
	}
	return d.expand(n, path)
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind != yaml.MappingNode {
		return &Error{Path: path, Line: n.Line, Msg: "want a mapping, got " + kindName(n)}
	}
	fields := map[string][]int{}
	var names []string
	collectFields(v.Type(), nil, fields, &names)
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		fp := kn.Value
		if path != "" {
			fp = path + "." + kn.Value
		}
		idx, ok := fields[kn.Value]
		if msg, gone := movedFields[fp]; gone && !ok {
			return &Error{Path: fp, Line: kn.Line, Msg: msg}
		}
		if !ok {
			return &Error{Path: fp, Line: kn.Line, Msg: "unknown field (known: " + strings.Join(names, ", ") + ")"}
		}
		if seen[kn.Value] {
			return &Error{Path: fp, Line: kn.Line, Msg: "field given twice"}
		}
		seen[kn.Value] = true
		if err := d.decode(vn, v.FieldByIndex(idx), fp); err != nil {
			return err
		}
		d.lines[fp] = kn.Line // a field is where its name is written
	}
	return nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "nothing"
}

// parse decodes YAML text strictly into out and returns the line of every
// field path it set.
func parse(data []byte, out any, lookupEnv func(string) (string, bool)) (map[string]int, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Error{Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(doc.Content) == 0 {
		return nil, &Error{Msg: "the file is empty"}
	}
	d := &decoder{lookupEnv: lookupEnv, lines: map[string]int{}}
	err := d.decode(doc.Content[0], reflect.ValueOf(out).Elem(), "")
	return d.lines, err
}

// collectFields maps the YAML names of t's fields, including those of
// ",inline" embedded structs, to their field index paths.
func collectFields(t reflect.Type, prefix []int, fields map[string][]int, names *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		idx := append(append([]int(nil), prefix...), i)
		if opts == "inline" && f.Type.Kind() == reflect.Struct {
			collectFields(f.Type, idx, fields, names)
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		fields[name] = idx
		*names = append(*names, name)
	}
}
