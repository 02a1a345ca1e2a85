package toolschema_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/toolschema"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

var noteTool = agent.Tool{Name: "add_note",
	InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","minLength":1},"tags":{"type":"array","items":{"type":"string"}},"priority":{"type":"integer","minimum":1,"maximum":5}},"required":["text"],"additionalProperties":false}`)}

// TestCheckInput: JSON passes as it is, malformed JSON is repaired once, input the schema refuses is refused
// with the field and the rule (golden: testdata/check.golden).
func TestCheckInput(t *testing.T) {
	t.Parallel()
	c, err := toolschema.New(noteTool)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, args string
		want       string // the input used ("" when refused with input nil)
		refused    bool
	}{
		{"valid", `{"text":"milk"}`, `{"text":"milk"}`, false},
		{"empty arguments are an empty object", ``, `{}`, true},
		{"trailing comma repaired", `{"text":"milk",}`, `{"text":"milk"}`, false},
		{"single quotes repaired", `{'text': 'milk'}`, `{"text": "milk"}`, false},
		{"truncated repaired", `{"text":"milk`, `{"text":"milk"}`, false},
		{"python constants repaired, then refused", `{"text":"a","priority":None}`, `{"text":"a","priority":null}`, true},
		{"wrong type", `{"text":42}`, `{"text":42}`, true},
		{"missing required", `{"tags":["x"]}`, `{"tags":["x"]}`, true},
		{"extra property", `{"text":"a","colour":"red"}`, `{"text":"a","colour":"red"}`, true},
		{"several violations", `{"text":"","priority":9,"tags":[1]}`, `{"text":"","priority":9,"tags":[1]}`, true},
		{"not an object", `["text"]`, `["text"]`, true},
	}
	var golden strings.Builder
	for _, tc := range cases {
		input, err := c.CheckInput(noteTool, tc.args)
		if string(input) != tc.want {
			t.Errorf("%s: input %s, want %s", tc.name, input, tc.want)
		}
		if (err != nil) != tc.refused {
			t.Errorf("%s: err %v, refused want %v", tc.name, err, tc.refused)
		}
		if err != nil {
			if agent.CodeOf(err) != agent.CodeInvalidToolInput || agent.KindOf(err) != agent.KindInvalid {
				t.Errorf("%s: %v is not invalid/%s", tc.name, err, agent.CodeInvalidToolInput)
			}
			_, msg := agent.Public(err)
			golden.WriteString(tc.name + ": " + msg + "\n")
		}
	}
	checkGolden(t, "check.golden", golden.String())
}

// TestRepair: what cannot be repaired is refused, never guessed into a tool call.
func TestRepair(t *testing.T) {
	t.Parallel()
	for _, args := range []string{`{"text": "a"}}}}`} {
		in, repaired, err := toolschema.Repair(args)
		if err == nil && !json.Valid(in) {
			t.Errorf("%q: repaired to invalid JSON %s", args, in)
		}
		_ = repaired
	}
	if _, repaired, err := toolschema.Repair(`{"a":1}`); err != nil || repaired {
		t.Errorf("valid JSON: repaired %v, err %v", repaired, err)
	}
}

// TestNew refuses a tool whose schema is not a JSON Schema, and one that refers to another document.
func TestNew(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		schema string
		ok     bool
	}{
		{"none", ``, true},
		{"object", `{"type":"object"}`, true},
		{"draft-07", `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`, true},
		{"not JSON", `{"type":`, false},
		{"unknown type", `{"type":"objekt"}`, false},
		{"bad minimum", `{"type":"integer","minimum":"one"}`, false},
		{"remote ref", `{"$ref":"https://example.com/schema.json"}`, false},
	}
	for _, tc := range cases {
		_, err := toolschema.New(agent.Tool{Name: "t", InputSchema: json.RawMessage(tc.schema)})
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// TestCheckInputUnusableSchema: a tool whose schema does not compile (a source's tool, not given to New) is
// refused with a message that does not leak the compiler's text.
func TestCheckInputUnusableSchema(t *testing.T) {
	t.Parallel()
	c, _ := toolschema.New()
	_, err := c.CheckInput(agent.Tool{Name: "bad", InputSchema: json.RawMessage(`{"type":"objekt"}`)}, `{}`)
	if _, msg := agent.Public(err); err == nil || strings.Contains(msg, "objekt") {
		t.Fatalf("err %v", err)
	}
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (run with -update to rewrite it):\n--- got\n%s--- want\n%s", name, got, want)
	}
}

// FuzzCheckInput: whatever the model sends, the check returns input that is JSON or a refusal of the
// invalid_tool_input kind, never a panic, and input it accepts passes the schema again as it is.
func FuzzCheckInput(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"text":"a"}`, `{'text': 'a',}`, `{"text":"a`, `[1,2`, `None`, `{"text":"\u00e9"}`,
		"```json\n{\"text\":\"a\"}\n```", `{"text": "a" "b"}`, `{text: a}`, `"just a string"`, `{"a":{"b":[{"c":`} {
		f.Add(seed)
	}
	c, err := toolschema.New(noteTool)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, args string) {
		input, err := c.CheckInput(noteTool, args)
		if input != nil && !json.Valid(input) {
			t.Fatalf("%q: input %q is not JSON", args, input)
		}
		if err != nil {
			if agent.CodeOf(err) != agent.CodeInvalidToolInput {
				t.Fatalf("%q: %v", args, err)
			}
			return
		}
		if _, err := c.CheckInput(noteTool, string(input)); err != nil {
			t.Fatalf("%q: accepted %s, which is then refused: %v", args, input, err)
		}
	})
}
