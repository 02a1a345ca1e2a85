package openaiwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// Function is a tool as both OpenAI APIs take a function: its description, with its input examples folded in
// (the APIs have no field for them: each example, agent.ToolSpec.InputExamples, one compact JSON value per line
// under "Input examples:", the same text in every request so that the prompt prefix stays byte-stable), and its
// parameters, an empty object schema when it has none. Parameters that are not a JSON object are an error
// (KindInternal: a tool the server registered wrong).
func Function(t agent.ToolSpec) (description string, parameters json.RawMessage, err error) {
	parameters = t.Parameters
	if len(parameters) > 0 && string(parameters) != "null" {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(parameters, &obj); err != nil || obj == nil {
			if err == nil {
				err = errors.New("not a JSON object")
			}
			return "", nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "tool "+t.Name+": parameters are not a JSON object")
		}
	} else {
		parameters = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	return describe(t), parameters, nil
}

func describe(t agent.ToolSpec) string {
	if len(t.InputExamples) == 0 {
		return t.Description
	}
	var b strings.Builder
	b.WriteString(t.Description)
	if b.Len() > 0 {
		b.WriteString("\n\n")
	}
	b.WriteString("Input examples:")
	for _, ex := range t.InputExamples {
		var c bytes.Buffer
		if json.Compact(&c, ex) != nil {
			continue
		}
		b.WriteString("\n")
		b.Write(c.Bytes())
	}
	return b.String()
}
