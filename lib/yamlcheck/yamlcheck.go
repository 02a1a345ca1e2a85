// Package yamlcheck is what the configuration files' parsers share (lib/toolsfile, lib/modelsfile): a file read
// as YAML (JSON is YAML) and checked whole, walking its nodes so that every problem is told by file, line and
// field ("tools.yaml:12: httpTools[0].method: want GET or POST"), all of them at once, in line order.
package yamlcheck

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Error is one problem of a file: file:line: field: message.
type Error struct {
	File  string
	Line  int
	Field string // e.g. httpTools[0].method ("" for the file as a whole)
	Msg   string
}

func (e Error) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// Errors are all the problems of a file, by line.
type Errors []Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// Sort puts es in line order (stable: problems of one line in the order they were found).
func (es Errors) Sort() {
	slices.SortStableFunc(es, func(a, b Error) int { return a.Line - b.Line })
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// SyntaxError turns the YAML parser's error into file:line: message.
func SyntaxError(file string, err error) Error {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return Error{File: file, Line: line, Msg: "not valid YAML or JSON: " + m[2]}
	}
	return Error{File: file, Line: 1, Msg: "not valid YAML or JSON: " + strings.TrimPrefix(msg, "yaml: ")}
}

// Checker gathers the problems of File as a parser walks its nodes; a parser embeds it.
type Checker struct {
	File string
	Errs Errors
}

// Errorf records a problem at n's line, of field.
func (c *Checker) Errorf(n *yaml.Node, field, format string, args ...any) {
	c.Errs = append(c.Errs, Error{File: c.File, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// Join is the field key of path ("models[0]" and "name": "models[0].name").
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Mapping calls the field's handler for each key of n; unknown and repeated keys are errors. present has the
// keys given.
func (c *Checker) Mapping(n *yaml.Node, path string, fields map[string]func(*yaml.Node, string)) (present map[string]bool) {
	present = map[string]bool{}
	n = Resolve(n)
	if n.Kind != yaml.MappingNode {
		c.Errorf(n, path, "want a mapping of fields, got %s", KindOf(n))
		return present
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		key := k.Value
		field := Join(path, key)
		handle, known := fields[key]
		switch {
		case k.Kind != yaml.ScalarNode:
			c.Errorf(k, path, "a field name must be a plain string")
		case present[key]:
			c.Errorf(k, field, "given twice")
		case !known:
			c.Errorf(k, field, "unknown field (known: %s)", strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		default:
			present[key] = true
			handle(v, field)
		}
	}
	return present
}

// Sequence calls item for each element of the list n (path[i]); anything else is an error.
func (c *Checker) Sequence(n *yaml.Node, path string, item func(*yaml.Node, string)) {
	n = Resolve(n)
	if n.Kind != yaml.SequenceNode {
		c.Errorf(n, path, "want a list, got %s", KindOf(n))
		return
	}
	for i, e := range n.Content {
		item(Resolve(e), fmt.Sprintf("%s[%d]", path, i))
	}
}

// Str is the string n holds; anything else is an error (false).
func (c *Checker) Str(n *yaml.Node, path string) (string, bool) {
	n = Resolve(n)
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		c.Errorf(n, path, "want a string, got %s", KindOf(n))
		return "", false
	}
	return n.Value, true
}

// Resolve follows an alias.
func Resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// KindOf names what n is, for a message: "a mapping", "a list", "nothing", or a scalar's value quoted.
func KindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

// OrList is "a", "a or b", "a, b or c".
func OrList(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
