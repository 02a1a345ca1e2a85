package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// Issue 19 item 6: a server tool's progress reports stream as transient data-tool-progress parts {toolCallId,
// stage, message} and its preliminary outputs as tool-output-available with preliminary: true, all before its
// final output and in the order made; none reaches the stored transcript or the model.
func TestToolProgressStreamsOnly(t *testing.T) {
	t.Parallel()
	stages := agent.Tool{Name: "stages", Description: "Works in stages.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Kind: agent.ToolServer, Execute: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			inv.Progress("searching", "Looking at 3 sources")
			inv.Preliminary(json.RawMessage(`{"partial":true}`))
			inv.Progress("2/3", "Reading the second")
			return json.RawMessage(`"done"`), nil
		}}
	f := setup(t, withTools(stages))
	run, chunks := f.turn(t, "th", "u1", "/tool stages {}")
	if run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	var got []string
	output := -1
	for i, c := range chunks {
		switch c["type"] {
		case "data-tool-progress":
			d, _ := c["data"].(map[string]any)
			if c["transient"] != true || d["toolCallId"] == "" || c["id"] != d["toolCallId"] {
				t.Errorf("progress chunk %v: want transient, with the call's id", c)
			}
			if output >= 0 {
				t.Errorf("progress chunk %v after the tool's output", c)
			}
			got = append(got, d["stage"].(string)+": "+d["message"].(string))
		case "tool-output-available":
			if c["preliminary"] == true {
				if out, _ := c["output"].(map[string]any); out["partial"] != true || output >= 0 {
					t.Errorf("preliminary chunk %v: want the partial output, before the final one", c)
				}
				got = append(got, "preliminary")
				continue
			}
			output = i
			if c["output"] != "done" {
				t.Errorf("final output %v, want done", c)
			}
		}
	}
	if strings.Join(got, "|") != "searching: Looking at 3 sources|preliminary|2/3: Reading the second" {
		t.Errorf("progress %q", got)
	}
	for _, m := range f.messages(t, "th") {
		for _, p := range m.Parts {
			if strings.Contains(string(p), "tool-progress") || strings.Contains(string(p), "Looking at") || strings.Contains(string(p), "partial") {
				t.Errorf("message %s holds the progress: %s", m.ID, p)
			}
		}
	}
}
