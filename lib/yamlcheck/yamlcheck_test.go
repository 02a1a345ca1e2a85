package yamlcheck

import (
	"testing"

	"go.yaml.in/yaml/v3"
)

// A file's problems are told by file, line and field, in line order: unknown and repeated fields, wrong kinds.
func TestChecker(t *testing.T) {
	t.Parallel()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("a: x\nb: [1]\nz: 1\na: y\nlist: 3\n"), &doc); err != nil {
		t.Fatal(err)
	}
	c := &Checker{File: "f.yaml"}
	var got []string
	c.Mapping(doc.Content[0], "", map[string]func(*yaml.Node, string){
		"a":    func(n *yaml.Node, path string) { s, _ := c.Str(n, path); got = append(got, s) },
		"b":    func(n *yaml.Node, path string) { c.Str(n, path) },
		"list": func(n *yaml.Node, path string) { c.Sequence(n, path, func(*yaml.Node, string) {}) },
	})
	c.Errs.Sort()
	want := "f.yaml:2: b: want a string, got a list\n" +
		"f.yaml:3: z: unknown field (known: a, b, list)\n" +
		"f.yaml:4: a: given twice\n" +
		"f.yaml:5: list: want a list, got \"3\""
	if c.Errs.Error() != want || len(got) != 1 || got[0] != "x" {
		t.Fatalf("errors:\n%s\nwant:\n%s\n(strings %q)", c.Errs, want, got)
	}
}

func TestSyntaxError(t *testing.T) {
	t.Parallel()
	var v any
	err := yaml.Unmarshal([]byte("a: [1\nb: 2\n"), &v)
	if e := SyntaxError("f.yaml", err); e.Line < 1 || e.File != "f.yaml" || e.Field != "" || len(e.Msg) < len("not valid YAML or JSON: ") {
		t.Fatalf("%+v", e)
	}
}

func TestHelpers(t *testing.T) {
	t.Parallel()
	if Join("", "a") != "a" || Join("m[0]", "a") != "m[0].a" || OrList([]string{"a"}) != "a" || OrList([]string{"a", "b", "c"}) != "a, b or c" {
		t.Fatal("Join or OrList")
	}
}
