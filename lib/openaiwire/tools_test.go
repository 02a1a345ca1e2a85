package openaiwire

import (
	"encoding/json"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

func TestFunction(t *testing.T) {
	t.Parallel()
	desc, params, err := Function(agent.ToolSpec{Name: "f", Description: "Does f.",
		InputExamples: []json.RawMessage{json.RawMessage(`{ "a": 1 }`), json.RawMessage(`not json`), json.RawMessage(`{"b":[2]}`)}})
	if err != nil || desc != "Does f.\n\nInput examples:\n{\"a\":1}\n{\"b\":[2]}" || string(params) != `{"type":"object","properties":{}}` {
		t.Fatalf("%q %s %v", desc, params, err)
	}
	if desc, params, _ := Function(agent.ToolSpec{Name: "g", Description: "Plain.", Parameters: json.RawMessage(`{"type":"object"}`)}); desc != "Plain." || string(params) != `{"type":"object"}` {
		t.Fatalf("%q %s", desc, params)
	}
	for _, bad := range []string{`[]`, `{`, `"x"`} {
		if _, _, err := Function(agent.ToolSpec{Name: "h", Parameters: json.RawMessage(bad)}); agent.KindOf(err) != agent.KindInternal {
			t.Errorf("parameters %s: %v", bad, err)
		}
	}
}
