package uistream

import (
	"encoding/json"

	"github.com/agentloop/agentloop/lib/agent"
)

// sample is one complete reply used by the golden tests. The same streams are written to testdata/*.sse and
// checked there by the real AI SDK parsers (aisdktest), so the golden files double as conformance fixtures.
type sample struct {
	name   string
	chunks []Chunk
}

func finishMeta(status string) json.RawMessage {
	return json.RawMessage(`{"status":"` + status + `","runId":"run_1","model":"offline",` +
		`"usage":{"inputTokens":12,"outputTokens":7,"totalTokens":19,"cachedInputTokens":0}}`)
}

func samples() []sample {
	return []sample{
		{"text", []Chunk{
			Start{MessageID: "msg_text", Metadata: json.RawMessage(`{"status":"streaming","runId":"run_1"}`)},
			StartStep{},
			TextStart{ID: "txt_0"},
			TextDelta{ID: "txt_0", Delta: "You "},
			TextDelta{ID: "txt_0", Delta: "said: "},
			TextDelta{ID: "txt_0", Delta: "hello"},
			TextEnd{ID: "txt_0"},
			FinishStep{},
			Finish{FinishReason: agent.FinishStop, Metadata: finishMeta("completed")},
		}},
		{"tool_roundtrip", []Chunk{
			Start{MessageID: "msg_tool"},
			StartStep{},
			ToolInputStart{ToolCallID: "call_1", ToolName: "add_note"},
			ToolInputDelta{ToolCallID: "call_1", InputTextDelta: `{"ti`},
			ToolInputDelta{ToolCallID: "call_1", InputTextDelta: `tle":"milk",`},
			ToolInputDelta{ToolCallID: "call_1", InputTextDelta: `"body":"2 l"}`},
			ToolInputAvailable{ToolCallID: "call_1", ToolName: "add_note", Input: json.RawMessage(`{"title": "milk", "body": "2 l"}`)},
			ToolOutputAvailable{ToolCallID: "call_1", Output: json.RawMessage(`{"id":"note_1","saved":true}`)},
			FinishStep{},
			StartStep{},
			TextStart{ID: "txt_1"},
			TextDelta{ID: "txt_1", Delta: "Saved note_1."},
			TextEnd{ID: "txt_1"},
			FinishStep{},
			Finish{FinishReason: agent.FinishStop, Metadata: finishMeta("completed")},
		}},
		{"reasoning", []Chunk{
			Start{MessageID: "msg_reason"},
			StartStep{},
			ReasoningStart{ID: "rsn_0"},
			ReasoningDelta{ID: "rsn_0", Delta: "The user greets; "},
			ReasoningDelta{ID: "rsn_0", Delta: "greet back."},
			ReasoningEnd{ID: "rsn_0"},
			TextStart{ID: "txt_0"},
			TextDelta{ID: "txt_0", Delta: "Hi!"},
			TextEnd{ID: "txt_0"},
			FinishStep{},
			Finish{FinishReason: agent.FinishStop},
		}},
		{"error_finish", []Chunk{
			Start{MessageID: "msg_err"},
			StartStep{},
			TextStart{ID: "txt_0"},
			TextDelta{ID: "txt_0", Delta: "partial"},
			TextEnd{ID: "txt_0"},
			Error{ErrorText: "model_error: upstream returned 503"},
			FinishStep{},
			Finish{FinishReason: agent.FinishError, Metadata: finishMeta("failed")},
		}},
		{"data_parts", []Chunk{
			Start{MessageID: "msg_data"},
			StartStep{},
			Data{Type: "data-subagent-artifact", ID: "job_1", Data: json.RawMessage(`{"status":"running","activity":"searching"}`)},
			Data{Type: "data-subagent-artifact", ID: "job_1", Data: json.RawMessage(`{"status":"done","summary":"3 sources"}`)},
			Data{Type: "data-progress", Data: json.RawMessage(`{"pct":50}`), Transient: true},
			Data{Type: "data-note", Data: json.RawMessage(`"no id"`)},
			FinishStep{},
			Finish{FinishReason: agent.FinishStop},
		}},
		{"approval_request", []Chunk{
			Start{MessageID: "msg_appr"},
			StartStep{},
			ToolInputStart{ToolCallID: "call_del", ToolName: "delete_note"},
			ToolInputDelta{ToolCallID: "call_del", InputTextDelta: `{"id":"note_1"}`},
			ToolInputAvailable{ToolCallID: "call_del", ToolName: "delete_note", Input: json.RawMessage(`{"id":"note_1"}`)},
			ToolApprovalRequest{ApprovalID: "appr_1", ToolCallID: "call_del"},
			FinishStep{},
			Finish{FinishReason: agent.FinishToolCalls, Metadata: finishMeta("interrupted")},
		}},
		{"tool_failures", []Chunk{
			Start{MessageID: "msg_fail"},
			StartStep{},
			ToolInputStart{ToolCallID: "call_a", ToolName: "add_note"},
			ToolInputDelta{ToolCallID: "call_a", InputTextDelta: `{"title":`},
			ToolInputError{ToolCallID: "call_a", ToolName: "add_note", Input: json.RawMessage(`"{\"title\":"`), ErrorText: "invalid tool input: unexpected end of JSON"},
			ToolInputAvailable{ToolCallID: "call_b", ToolName: "list_notes", Input: json.RawMessage(`{}`)},
			ToolOutputError{ToolCallID: "call_b", ErrorText: "tool timed out after 30s"},
			ToolInputAvailable{ToolCallID: "call_c", ToolName: "delete_note", Input: json.RawMessage(`{"id":"x"}`)},
			ToolOutputDenied{ToolCallID: "call_c"},
			FinishStep{},
			Finish{FinishReason: agent.FinishToolCalls},
		}},
		{"tool_preliminary", []Chunk{
			Start{MessageID: "msg_prelim"},
			StartStep{},
			ToolInputAvailable{ToolCallID: "call_p", ToolName: "research_notes", Input: json.RawMessage(`{"q":"milk"}`)},
			Data{Type: "data-tool-progress", ID: "call_p", Data: json.RawMessage(`{"toolCallId":"call_p","stage":"1/2","message":"reading"}`), Transient: true},
			ToolOutputAvailable{ToolCallID: "call_p", Output: json.RawMessage(`{"found":1}`), Preliminary: true},
			ToolOutputAvailable{ToolCallID: "call_p", Output: json.RawMessage(`{"found":2,"done":true}`)},
			FinishStep{},
			Finish{FinishReason: agent.FinishToolCalls},
		}},
		{"metadata_and_escapes", []Chunk{
			Start{MessageID: "msg_esc"},
			MessageMetadata{Metadata: json.RawMessage(`{"title":"Grüße"}`)},
			StartStep{},
			TextStart{ID: "txt_0"},
			TextDelta{ID: "txt_0", Delta: "quote \" backslash \\ newline \n tab \t bell \a"},
			TextDelta{ID: "txt_0", Delta: "ünïcödé 🚀 <b>&amp;</b> line\u2028sep"},
			TextDelta{ID: "txt_0", Delta: "bad utf8: \xff\xfe end"},
			TextEnd{ID: "txt_0"},
			FinishStep{},
			Finish{FinishReason: agent.FinishLength, Metadata: json.RawMessage("{\n  \"status\": \"completed\"\n}")},
		}},
	}
}
