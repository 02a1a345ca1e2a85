package uistream

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

type bufSink struct{ bytes.Buffer }

func (s *bufSink) Append(frame []byte) { s.Write(frame) }

// jsonString is what encoding/json makes of s once encoded and decoded (invalid UTF-8 becomes U+FFFD).
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}

// FuzzEncoder: encoding any chunk of any kind never panics; a chunk is either refused with CodeInvalidChunk and
// writes nothing, or written as one frame; the client and the sink get the same bytes, which ParseFrames reads
// back as one JSON object per accepted chunk, of its type, with its string fields intact, then [DONE]. Run
// longer with: make fuzz (or go test -fuzz '^FuzzEncoder$' ./lib/uistream).
func FuzzEncoder(f *testing.F) {
	f.Add("txt_1", "hello", []byte(`{"a":1}`))
	f.Add("", "", []byte(nil))
	f.Add("call\n1", "\xff\u2028\"", []byte(`[1, 2 ,3]`))
	f.Add("c", "stop", []byte(`{"a":`))
	f.Add("c", "tool-calls", []byte("  null "))
	f.Fuzz(func(t *testing.T, id, s string, raw []byte) {
		if len(id)+len(s)+len(raw) > 4<<10 {
			// Every input is encoded into ~20 chunks and decoded again: large ones only slow the search (and
			// its minimizing) down, and size is not what this target is about.
			t.Skip()
		}
		chunks := []Chunk{
			Start{MessageID: id, Metadata: raw}, StartStep{}, TextStart{ID: id}, TextDelta{ID: id, Delta: s}, TextEnd{ID: id},
			ReasoningStart{ID: id}, ReasoningDelta{ID: id, Delta: s}, ReasoningEnd{ID: id},
			ToolInputStart{ToolCallID: id, ToolName: s}, ToolInputDelta{ToolCallID: id, InputTextDelta: s},
			ToolInputAvailable{ToolCallID: id, ToolName: s, Input: raw}, ToolInputError{ToolCallID: id, ToolName: s, Input: raw, ErrorText: s},
			ToolOutputAvailable{ToolCallID: id, Output: raw}, ToolOutputError{ToolCallID: id, ErrorText: s},
			ToolApprovalRequest{ApprovalID: s, ToolCallID: id}, ToolOutputDenied{ToolCallID: id},
			Data{Type: "data-" + s, ID: id, Data: raw}, Data{Type: s, Data: raw, Transient: true}, Error{ErrorText: s},
			Finish{FinishReason: agent.FinishReason(s), Metadata: raw}, MessageMetadata{Metadata: raw}, FinishStep{},
		}
		var client bytes.Buffer
		sink := &bufSink{}
		enc := NewEncoder(&client, sink)
		var accepted []Chunk
		for _, c := range chunks {
			before := enc.Frames()
			if err := enc.Encode(c); err != nil {
				var ae *agent.Error
				if !errors.As(err, &ae) || ae.Code != CodeInvalidChunk || enc.Frames() != before {
					t.Fatalf("%T refused with %v after writing %d frames", c, err, enc.Frames()-before)
				}
				continue
			}
			accepted = append(accepted, c)
		}
		enc.Done()
		if !bytes.Equal(client.Bytes(), sink.Bytes()) {
			t.Fatalf("the client and the sink got different bytes:\n%q\n%q", client.Bytes(), sink.Bytes())
		}
		payloads, done, err := ParseFrames(client.Bytes())
		if err != nil || !done || len(payloads) != len(accepted) {
			t.Fatalf("ParseFrames: %d chunks (want %d), done %v, %v\n%q", len(payloads), len(accepted), done, err, client.Bytes())
		}
		for i, p := range payloads {
			// UseNumber: a raw field holds any valid JSON, and 1E700 is valid JSON (JSON.parse makes it Infinity)
			// that a float64 cannot hold.
			var got map[string]any
			dec := json.NewDecoder(bytes.NewReader(p))
			dec.UseNumber()
			if err := dec.Decode(&got); err != nil || dec.More() {
				t.Fatalf("frame %d is not an object: %s", i, p)
			}
			c := accepted[i]
			if got["type"] != jsonString(c.ChunkType()) {
				t.Fatalf("frame %d has type %v, want %q", i, got["type"], c.ChunkType())
			}
			switch c := c.(type) {
			case TextDelta:
				if got["delta"] != jsonString(c.Delta) || got["id"] != jsonString(c.ID) {
					t.Fatalf("text-delta %s from %+v", p, c)
				}
			case ToolInputStart:
				if got["toolName"] != jsonString(c.ToolName) || got["toolCallId"] != jsonString(c.ToolCallID) {
					t.Fatalf("tool-input-start %s from %+v", p, c)
				}
			case Error:
				if got["errorText"] != jsonString(c.ErrorText) {
					t.Fatalf("error %s from %+v", p, c)
				}
			}
		}
	})
}
