package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// Issue 19 item 6: a server tool's progress reports stream as transient data-tool-progress parts {toolCallId,
// stage, message} and its preliminary outputs as tool-output-available with preliminary: true, all before its
// final output and in the order made; none reaches the stored transcript or the model; the stream parses under
// every supported ai version.
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
	run, raw := f.run(t, submit("th", "u1", "/tool stages {}"))
	if run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	chunks := parseSSE(t, raw)
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
	// The stream the engine wrote parses under every ai version the README supports (ai@6.0.0, the newest ai@6
	// and ai@7): each reads both progress chunks and both outputs, and builds the tool part with the final output
	// (the preliminary one replaced, no progress part).
	for _, p := range aisdktest.CheckStreams(t, raw) {
		read := strings.Join(p.ChunkTypes, ",")
		if strings.Count(read, "data-tool-progress") != 2 || strings.Count(read, "tool-output-available") != 2 {
			t.Errorf("ai@%s read %s, want two data-tool-progress and two tool-output-available chunks", p.SDKVersion, read)
		}
		parts, err := p.Parts()
		if err != nil {
			t.Fatal(err)
		}
		var tool *agent.Part
		for i := range parts {
			if strings.HasPrefix(parts[i].Type, "data-") {
				t.Errorf("ai@%s kept a %s part", p.SDKVersion, parts[i].Type)
			}
			if parts[i].Type == "tool-stages" {
				tool = &parts[i]
			}
		}
		if tool == nil || tool.State != agent.StateOutputAvailable || string(tool.Output) != `"done"` {
			t.Errorf("ai@%s built %s, want the stages part with the final output", p.SDKVersion, p.Message.Parts)
		}
	}
}
