package aisdktest_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// encode runs chunks through a real Encoder and returns the bytes the client received.
func encode(t *testing.T, chunks ...uistream.Chunk) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := uistream.NewEncoder(&buf, nil)
	for _, c := range chunks {
		if err := e.Encode(c); err != nil {
			t.Fatalf("%s: %v", c.ChunkType(), err)
		}
	}
	e.Done()
	return buf.Bytes()
}

func meta(t *testing.T, md agent.MessageMetadata) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// setup returns a function that writes a stream body to a file in a fresh temporary directory.
func setup(t *testing.T) (write func(name string, body []byte) string) {
	t.Helper()
	dir := t.TempDir()
	return func(name string, body []byte) string {
		t.Helper()
		f := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".sse")
		if err := os.WriteFile(f, body, 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
}

// stream is one sample reply and what both SDKs must make of it.
type stream struct {
	name   string
	body   []byte
	expect func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part)
}

func partTypes(parts []agent.Part) string {
	var types []string
	for _, p := range parts {
		types = append(types, p.Type)
	}
	return strings.Join(types, ",")
}

func samples(t *testing.T) []stream {
	t.Helper()
	usage := &agent.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15, CachedInputTokens: 2}
	final := meta(t, agent.MessageMetadata{Status: agent.MessageCompleted, RunID: "run_1", Model: "offline", Usage: usage})
	return []stream{
		{"plain text", encode(t,
			uistream.Start{MessageID: "msg_1"},
			uistream.StartStep{},
			uistream.TextStart{ID: "t0"},
			uistream.TextDelta{ID: "t0", Delta: "You said: "},
			uistream.TextDelta{ID: "t0", Delta: "hi \"there\"\n🚀"},
			uistream.TextEnd{ID: "t0"},
			uistream.FinishStep{},
			uistream.Finish{FinishReason: agent.FinishStop, Metadata: final},
		), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			if p.Message.ID != "msg_1" || p.Message.Role != agent.RoleAssistant || p.FinishReason != "stop" {
				t.Errorf("message %s role %s finish %q", p.Message.ID, p.Message.Role, p.FinishReason)
			}
			if partTypes(parts) != "step-start,text" || parts[1].Text != "You said: hi \"there\"\n🚀" || parts[1].State != "done" {
				t.Errorf("parts = %+v", parts)
			}
			md := p.Message.Meta()
			if md.Status != agent.MessageCompleted || md.RunID != "run_1" || md.Model != "offline" || md.Usage == nil || *md.Usage != *usage {
				t.Errorf("metadata = %s", p.Message.Metadata)
			}
		}},
		{"tool round trip", encode(t,
			uistream.Start{MessageID: "msg_2"},
			uistream.StartStep{},
			uistream.ToolInputStart{ToolCallID: "call_1", ToolName: "add_note"},
			uistream.ToolInputDelta{ToolCallID: "call_1", InputTextDelta: `{"title":"mi`},
			uistream.ToolInputDelta{ToolCallID: "call_1", InputTextDelta: `lk"}`},
			uistream.ToolInputAvailable{ToolCallID: "call_1", ToolName: "add_note", Input: json.RawMessage(`{"title":"milk"}`)},
			uistream.ToolOutputAvailable{ToolCallID: "call_1", Output: json.RawMessage(`{"id":"note_1"}`)},
			uistream.FinishStep{},
			uistream.StartStep{},
			uistream.TextStart{ID: "t1"},
			uistream.TextDelta{ID: "t1", Delta: "Saved."},
			uistream.TextEnd{ID: "t1"},
			uistream.FinishStep{},
			uistream.Finish{FinishReason: agent.FinishStop, Metadata: final},
		), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			if partTypes(parts) != "step-start,tool-add_note,step-start,text" {
				t.Fatalf("parts = %s", partTypes(parts))
			}
			tool := parts[1]
			if tool.ToolCallID != "call_1" || tool.State != agent.StateOutputAvailable ||
				string(tool.Input) != `{"title":"milk"}` || string(tool.Output) != `{"id":"note_1"}` {
				t.Errorf("tool part = %+v", tool)
			}
		}},
		{"tool preliminary output and progress", encode(t,
			uistream.Start{MessageID: "msg_p"},
			uistream.StartStep{},
			uistream.ToolInputAvailable{ToolCallID: "call_p", ToolName: "lookup", Input: json.RawMessage(`{"q":"milk"}`)},
			uistream.Data{Type: "data-tool-progress", ID: "call_p", Data: json.RawMessage(`{"toolCallId":"call_p","stage":"1/2","message":"reading"}`), Transient: true},
			uistream.ToolOutputAvailable{ToolCallID: "call_p", Output: json.RawMessage(`{"found":1}`), Preliminary: true},
			uistream.ToolOutputAvailable{ToolCallID: "call_p", Output: json.RawMessage(`{"found":2}`)},
			uistream.FinishStep{},
			uistream.Finish{FinishReason: agent.FinishStop, Metadata: final},
		), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			// The transient progress is no part; the final output replaces the preliminary one.
			if partTypes(parts) != "step-start,tool-lookup" {
				t.Fatalf("parts = %s", partTypes(parts))
			}
			if tool := parts[1]; tool.State != agent.StateOutputAvailable || string(tool.Output) != `{"found":2}` {
				t.Errorf("tool part = %+v", tool)
			}
		}},
		{"reasoning", encode(t,
			uistream.Start{MessageID: "msg_3"},
			uistream.StartStep{},
			uistream.ReasoningStart{ID: "r0"},
			uistream.ReasoningDelta{ID: "r0", Delta: "think"},
			uistream.ReasoningEnd{ID: "r0"},
			uistream.TextStart{ID: "t0"},
			uistream.TextDelta{ID: "t0", Delta: "answer"},
			uistream.TextEnd{ID: "t0"},
			uistream.FinishStep{},
			uistream.Finish{FinishReason: agent.FinishStop},
		), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			if partTypes(parts) != "step-start,reasoning,text" || parts[1].Text != "think" || parts[2].Text != "answer" {
				t.Errorf("parts = %+v", parts)
			}
		}},
		{"error then finish", encode(t,
			uistream.Start{MessageID: "msg_4"},
			uistream.StartStep{},
			uistream.TextStart{ID: "t0"},
			uistream.TextDelta{ID: "t0", Delta: "partial"},
			uistream.TextEnd{ID: "t0"},
			uistream.Error{ErrorText: "model_error: upstream 503"},
			uistream.FinishStep{},
			uistream.Finish{FinishReason: agent.FinishError,
				Metadata: meta(t, agent.MessageMetadata{Status: agent.MessageFailed, RunID: "run_1"})},
		), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			if len(p.Errors) != 1 || p.Errors[0] != "model_error: upstream 503" || p.FinishReason != "error" {
				t.Errorf("errors %q finish %q", p.Errors, p.FinishReason)
			}
			if p.Message.Meta().Status != agent.MessageFailed || partTypes(parts) != "step-start,text" {
				t.Errorf("message = %+v", p.Message)
			}
		}},
		{"data part", encode(t,
			uistream.Start{MessageID: "msg_5"},
			uistream.Data{Type: "data-subagent-artifact", ID: "job_1", Data: json.RawMessage(`{"status":"running"}`)},
			uistream.Data{Type: "data-subagent-artifact", ID: "job_1", Data: json.RawMessage(`{"status":"done"}`)},
			uistream.Data{Type: "data-ping", Data: json.RawMessage(`1`), Transient: true},
			uistream.Finish{},
		), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			if partTypes(parts) != "data-subagent-artifact" || parts[0].ID != "job_1" || string(parts[0].Data) != `{"status":"done"}` {
				t.Errorf("parts = %+v", parts)
			}
		}},
		{"approval request", encode(t, approvalChunks(t)...), func(t *testing.T, p aisdktest.ParsedMessage, parts []agent.Part) {
			if partTypes(parts) != "step-start,tool-delete_note" {
				t.Fatalf("parts = %s", partTypes(parts))
			}
			tool := parts[1]
			if tool.State != agent.StateApprovalRequested || tool.Approval == nil || tool.Approval.ID != "appr_1" {
				t.Errorf("tool part = %+v", tool)
			}
			if p.Message.Meta().Status != agent.MessageInterrupted {
				t.Errorf("metadata = %s", p.Message.Metadata)
			}
		}},
	}
}

func approvalChunks(t *testing.T) []uistream.Chunk {
	t.Helper()
	return []uistream.Chunk{
		uistream.Start{MessageID: "msg_6"},
		uistream.StartStep{},
		uistream.ToolInputStart{ToolCallID: "call_d", ToolName: "delete_note"},
		uistream.ToolInputDelta{ToolCallID: "call_d", InputTextDelta: `{"id":"note_1"}`},
		uistream.ToolInputAvailable{ToolCallID: "call_d", ToolName: "delete_note", Input: json.RawMessage(`{"id":"note_1"}`)},
		uistream.ToolApprovalRequest{ApprovalID: "appr_1", ToolCallID: "call_d"},
		uistream.FinishStep{},
		uistream.Finish{FinishReason: agent.FinishToolCalls,
			Metadata: meta(t, agent.MessageMetadata{Status: agent.MessageInterrupted, RunID: "run_1"})},
	}
}

// Streams built by the Encoder, and the golden files of the uistream package, parse in every SDK version to
// the UIMessage a browser would show.
func TestEncoderStreamsParseInBothSDKs(t *testing.T) {
	t.Parallel()
	write := setup(t)
	streams := samples(t)
	var files []string
	for _, s := range streams {
		files = append(files, write(s.name, s.body))
	}
	goldens, err := filepath.Glob(filepath.Join("..", "testdata", "*.sse"))
	if err != nil || len(goldens) == 0 {
		t.Fatalf("no golden files (%v)", err)
	}
	results := aisdktest.Check(t, append(files, goldens...)...)
	if len(results) != len(aisdktest.SDKs)*(len(files)+len(goldens)) {
		t.Fatalf("got %d results for %d files", len(results), len(files)+len(goldens))
	}
	for i, s := range streams {
		for _, p := range aisdktest.OfFile(results, i) {
			t.Run(s.name+"/ai@"+p.SDK, func(t *testing.T) {
				parts, err := p.Parts()
				if err != nil {
					t.Fatal(err)
				}
				s.expect(t, p, parts)
			})
		}
	}
	seen := map[string]bool{}
	for _, p := range results {
		seen[p.SDK+"/"+p.Node[:3]] = true
	}
	if !seen["6.0/v20"] && !seen["6.0/v18"] || !seen["6/v20"] && !seen["6/v18"] || !seen["7/v22"] {
		t.Errorf("SDK/Node combinations checked: %v; want ai@6.0.0 and the newest ai@6 on the system Node and ai@7 on Node 22", seen)
	}
	versions := map[string]string{}
	for _, p := range results {
		versions[p.SDK] = p.SDKVersion
	}
	if versions[aisdktest.SDK60] != "6.0.0" || !strings.HasPrefix(versions[aisdktest.SDK6], "6.") || !strings.HasPrefix(versions[aisdktest.SDK7], "7.") {
		t.Errorf("SDK versions checked: %v; want ai@6.0.0, an ai@6 and an ai@7", versions)
	}
}

// After an approval answer the next run re-opens the same assistant message; the client reduces the
// continuation onto the message it has.
func TestContinuationAfterApproval(t *testing.T) {
	t.Parallel()
	first := aisdktest.CheckStreams(t, encode(t, approvalChunks(t)...))
	second := encode(t,
		uistream.Start{MessageID: "msg_6"},
		uistream.StartStep{},
		uistream.ToolOutputDenied{ToolCallID: "call_d"},
		uistream.TextStart{ID: "t2"},
		uistream.TextDelta{ID: "t2", Delta: "Okay, I kept the note."},
		uistream.TextEnd{ID: "t2"},
		uistream.FinishStep{},
		uistream.Finish{FinishReason: agent.FinishStop,
			Metadata: meta(t, agent.MessageMetadata{Status: agent.MessageCompleted, RunID: "run_2"})},
	)
	write := setup(t)
	var inputs []aisdktest.Input
	for _, prev := range first {
		// Continue the message as this SDK major left it (the client's copy), with the user's denial applied
		// the way addToolApprovalResponse does.
		msg := prev.Message
		msg.Parts = slices.Clone(msg.Parts)
		tool, err := agent.DecodePart(msg.Parts[1])
		if err != nil {
			t.Fatal(err)
		}
		denied := false
		tool.State = agent.StateApprovalResponded
		tool.Approval = &agent.PartApproval{ID: "appr_1", Approved: &denied}
		msg.Parts[1] = agent.EncodePart(tool)
		inputs = append(inputs, aisdktest.Input{File: write("continuation_"+prev.SDK, second), Continues: &msg})
	}
	results := aisdktest.CheckInputs(t, inputs...)
	for i, p := range results {
		parts, err := p.Parts()
		if err != nil {
			t.Fatal(err)
		}
		from := first[i/len(aisdktest.SDKs)].SDK
		if p.Message.ID != "msg_6" || partTypes(parts) != "step-start,tool-delete_note,step-start,text" {
			t.Fatalf("ai@%s (continuing ai@%s's message): parts = %s", p.SDK, from, partTypes(parts))
		}
		if parts[1].State != agent.StateOutputDenied || p.Message.Meta().RunID != "run_2" || parts[3].Text != "Okay, I kept the note." {
			t.Errorf("ai@%s (continuing ai@%s's message): parts %+v, metadata %s", p.SDK, from, parts, p.Message.Metadata)
		}
	}
}

// The checker must be able to fail: each of these streams breaks the protocol for at least one SDK major.
func TestCheckerRejectsBadStreams(t *testing.T) {
	t.Parallel()
	bad := map[string]string{
		"ai7_only_finish_reason": "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"finish\",\"finishReason\":\"interrupted\"}\n\ndata: [DONE]\n\n",
		"undeclared_field":       "data: {\"type\":\"start\",\"messageId\":\"m\",\"extra\":1}\n\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n",
		"ai7_only_field":         "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"tool-input-available\",\"toolCallId\":\"c\",\"toolName\":\"t\",\"input\":{}}\n\ndata: {\"type\":\"tool-approval-request\",\"approvalId\":\"a\",\"toolCallId\":\"c\",\"isAutomatic\":false}\n\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n",
		"missing_done":           "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"finish\"}\n\n",
		"delta_without_start":    "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"x\"}\n\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n",
		"unknown_type":           "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"bogus\"}\n\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n",
		"no_finish":              "data: {\"type\":\"start\"}\n\ndata: [DONE]\n\n",
		"multi_line_frame":       "data: {\"type\":\"start\"}\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n",
	}
	write := setup(t)
	var inputs []aisdktest.Input
	for name, body := range bad {
		inputs = append(inputs, aisdktest.Input{File: write(name, []byte(body))})
	}
	_, err := aisdktest.Run(t.Context(), inputs...)
	if err == nil {
		t.Fatal("the checker accepted every bad stream")
	}
	for name := range bad {
		if !strings.Contains(err.Error(), name+".sse: ai@") {
			t.Errorf("%s was not reported:\n%v", name, err)
		}
	}
}

// The POST stream of a run that handed over (README "Runs longer than one invocation"): a step, then message
// metadata with handover true, [DONE] and no finish. Every SDK parses it without an error and keeps the partial
// reply with the metadata, and AbstractChat, given it as its POST's answer, ends ready with no error (check.mjs
// --handover); the same stream without the metadata, or with a finish, is refused in that mode, and without the
// mode (no finish) as any stream.
func TestHandedOverPOSTStream(t *testing.T) {
	t.Parallel()
	step := []uistream.Chunk{
		uistream.Start{MessageID: "msg_ho", Metadata: meta(t, agent.MessageMetadata{RunID: "run_ho"})},
		uistream.StartStep{},
		uistream.ToolInputAvailable{ToolCallID: "call_1", ToolName: "add_note", Input: json.RawMessage(`{"text":"x"}`)},
		uistream.ToolOutputAvailable{ToolCallID: "call_1", Output: json.RawMessage(`{"id":"note_1","text":"x"}`)},
		uistream.FinishStep{},
	}
	handover := uistream.MessageMetadata{Metadata: json.RawMessage(`{"runId":"run_ho","status":"streaming","handover":true}`)}
	write := setup(t)
	good := write("handed over", encode(t, append(slices.Clone(step), handover)...))
	for _, p := range aisdktest.CheckInputs(t, aisdktest.Input{File: good, HandOver: true}) {
		parts, err := p.Parts()
		if err != nil {
			t.Fatal(err)
		}
		var md map[string]any
		if err := json.Unmarshal(p.Message.Metadata, &md); err != nil {
			t.Fatal(err)
		}
		if !p.HandOver || p.FinishReason != "" || len(p.Errors) != 0 || p.Message.ID != "msg_ho" || md["handover"] != true ||
			partTypes(parts) != "step-start,tool-add_note" || parts[1].State != agent.StateOutputAvailable {
			t.Errorf("ai@%s made %s of the handed-over stream: parts %s, metadata %s, finish %q, errors %v", p.SDK, p.Message.ID,
				partTypes(parts), p.Message.Metadata, p.FinishReason, p.Errors)
		}
	}

	bad := map[string][]byte{
		"no_handover_metadata": encode(t, step...),
		"finished":             encode(t, append(slices.Clone(step), handover, uistream.Finish{FinishReason: "stop"})...),
	}
	var inputs []aisdktest.Input
	for name, body := range bad {
		inputs = append(inputs, aisdktest.Input{File: write(name, body), HandOver: true})
	}
	inputs = append(inputs, aisdktest.Input{File: good}) // no finish: refused as an ordinary stream
	_, err := aisdktest.Run(t.Context(), inputs...)
	if err == nil {
		t.Fatal("the checker accepted every bad hand-over stream")
	}
	for _, name := range []string{"no_handover_metadata", "finished", "handed_over"} {
		if !strings.Contains(err.Error(), name+".sse: ai@") {
			t.Errorf("%s was not reported:\n%v", name, err)
		}
	}
}
