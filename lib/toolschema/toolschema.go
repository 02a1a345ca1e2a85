// Package toolschema checks a tool call's input before the tool runs (agent.ToolInputs): arguments that are not
// JSON are repaired once (github.com/kaptinlin/jsonrepair, a Go port of the jsonrepair library: trailing commas,
// single quotes, unquoted keys, Python constants, a truncated object closed), and the input is validated against
// the tool's JSON schema (github.com/santhosh-tekuri/jsonschema/v6, drafts 4 to 2020-12; a schema without
// "$schema" is read as 2020-12). The same check serves every tool source: Go tools, MCP tools, HTTP tools.
//
// A refusal is an *agent.Error (KindInvalid, agent.CodeInvalidToolInput) whose message names each violation by
// the field's JSON pointer and the schema keyword it breaks, e.g.
//
//	input does not match the tool's schema: at "/text": got number, want string (type)
//
// and nothing else (no schema URL, no internal text): it is what the model reads, so it can call again.
//
// Schemas are compiled once per tool definition (name + schema bytes) and kept by the Checker; a schema that
// does not compile refuses every call of its tool (New refuses it at cold start for the tools it is given).
// Schemas are self-contained: a "$ref" to another document is not loaded (no file or network access).
package toolschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kaptinlin/jsonrepair"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentloop/agentloop/lib/agent"
)

// MaxViolations bounds the violations one refusal names (the rest are counted).
const MaxViolations = 5

// Checker is an agent.ToolInputs. The zero value is not usable: call New.
type Checker struct {
	mu      sync.Mutex
	schemas map[string]compiled // by tool name + "\x00" + schema bytes
}

type compiled struct {
	schema *jsonschema.Schema
	err    error
}

// New returns a Checker with the schemas of tools compiled; it refuses a tool whose schema is not a valid JSON
// Schema (a cold start should fail on it, not the model's first call).
func New(tools ...agent.Tool) (*Checker, error) {
	c := &Checker{schemas: map[string]compiled{}}
	var errs []error
	for _, t := range tools {
		if _, err := c.schema(t); err != nil {
			errs = append(errs, fmt.Errorf("tool %q: %w", t.Name, err))
		}
	}
	return c, errors.Join(errs...)
}

// Compile reports whether schema is a valid JSON Schema (the tools file checks its inputSchema with it).
func Compile(schema json.RawMessage) error {
	_, err := compile(schema)
	return err
}

// ValidateJSON checks input against schema, compiled for the one check (the tools file checks its
// inputExamples with it).
func ValidateJSON(schema, input json.RawMessage) error {
	sch, err := compile(schema)
	if err != nil {
		return err
	}
	return Validate(sch, input)
}

// CheckInput implements agent.ToolInputs.
func (c *Checker) CheckInput(tool agent.Tool, arguments string) (json.RawMessage, error) {
	input, repaired, err := Repair(arguments)
	if err != nil {
		return nil, err
	}
	sch, err := c.schema(tool)
	if err != nil {
		return input, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "tool %q has no usable input schema; it cannot be called", tool.Name)
	}
	if sch == nil {
		return input, nil
	}
	if err := Validate(sch, input); err != nil {
		if repaired {
			return input, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "input was not valid JSON; repaired, it %s", err)
		}
		return input, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "input %s", err)
	}
	return input, nil
}

// Repair returns arguments as JSON: as they are when they are JSON ("" is {}), else repaired once (repaired
// true). Input that cannot be repaired is refused.
func Repair(arguments string) (input json.RawMessage, repaired bool, err error) {
	if strings.TrimSpace(arguments) == "" {
		return json.RawMessage(`{}`), false, nil
	}
	if json.Valid([]byte(arguments)) {
		return json.RawMessage(arguments), false, nil
	}
	fixed, err := repair(arguments)
	if err != nil || !json.Valid([]byte(fixed)) {
		return nil, false, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "tool input is not valid JSON and could not be repaired")
	}
	return json.RawMessage(fixed), true, nil
}

// repair is jsonrepair.Repair, with a panic of the library (on input nobody tried) turned into an error: the
// model's text must never take the process down.
func repair(text string) (fixed string, err error) {
	defer func() {
		if r := recover(); r != nil {
			fixed, err = "", fmt.Errorf("jsonrepair: %v", r)
		}
	}()
	return jsonrepair.Repair(text)
}

// Validate checks input against sch; the error says "does not match the tool's schema: …" with the violations.
func Validate(sch *jsonschema.Schema, input json.RawMessage) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(input))
	if err != nil {
		return errors.New("is not valid JSON")
	}
	err = sch.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return errors.New("could not be checked against the tool's schema")
	}
	var leaves []string
	collect(ve, &leaves)
	slices.Sort(leaves) // the validator walks an object's properties in map order
	msg := "does not match the tool's schema: " + strings.Join(leaves[:min(len(leaves), MaxViolations)], "; ")
	if n := len(leaves) - MaxViolations; n > 0 {
		msg += fmt.Sprintf("; and %d more", n)
	}
	return errors.New(msg)
}

// collect appends the leaf violations of ve: `at "<pointer>": <what> (<keyword>)`.
func collect(ve *jsonschema.ValidationError, out *[]string) {
	if len(ve.Causes) > 0 {
		for _, c := range ve.Causes {
			collect(c, out)
		}
		return
	}
	unit := ve.BasicOutput()
	what := "invalid"
	if unit.Error != nil {
		what = unit.Error.String()
	}
	rule := ""
	if kw := ve.ErrorKind.KeywordPath(); len(kw) > 0 {
		rule = " (" + kw[len(kw)-1] + ")"
	}
	*out = append(*out, fmt.Sprintf("at %q: %s%s", unit.InstanceLocation, what, rule))
}

// schema returns the tool's compiled schema (nil: the tool declares none, any JSON is accepted).
func (c *Checker) schema(t agent.Tool) (*jsonschema.Schema, error) {
	if len(bytes.TrimSpace(t.InputSchema)) == 0 {
		return nil, nil
	}
	key := t.Name + "\x00" + string(t.InputSchema)
	c.mu.Lock()
	defer c.mu.Unlock()
	if got, ok := c.schemas[key]; ok {
		return got.schema, got.err
	}
	sch, err := compile(t.InputSchema)
	c.schemas[key] = compiled{schema: sch, err: err}
	return sch, err
}

// schemaURL names every compiled schema (errors name instance paths, never it).
const schemaURL = "agentloop:tool-input.json"

func compile(schema json.RawMessage) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, fmt.Errorf("the input schema is not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("the input schema: %w", err)
	}
	sch, err := c.Compile(schemaURL)
	var sve *jsonschema.SchemaValidationError
	var ve *jsonschema.ValidationError
	if errors.As(err, &sve) && errors.As(sve.Err, &ve) {
		// Against the metaschema: the schema's own paths, as the input's are named.
		var leaves []string
		collect(ve, &leaves)
		slices.Sort(leaves)
		return nil, fmt.Errorf("the input schema is not a valid JSON Schema: %s", strings.Join(leaves[:min(len(leaves), MaxViolations)], "; "))
	}
	if err != nil {
		return nil, fmt.Errorf("the input schema is not a valid JSON Schema: %w", err)
	}
	return sch, nil
}

// noLoader loads nothing: a tool's schema is one self-contained document.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: schemas are self-contained; references to other documents are not loaded", url)
}
