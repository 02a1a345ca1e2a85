package agent

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzValidateIncoming: no message makes the validator panic; a refusal is a client error with one of the
// boundary's codes whose message names the part (or the message); an accepted message encodes and decodes to a
// message that is accepted again, and a user one holds only parts a person may author, its files ones a model
// reads. Run longer with: make fuzz (or go test -fuzz '^FuzzValidateIncoming$' ./lib/agent).
func FuzzValidateIncoming(f *testing.F) {
	for _, seed := range []string{
		`{"id":"u1","role":"user","parts":[{"type":"text","text":"hi"}]}`,
		`{"id":"u1","role":"user","parts":[{"type":"text","text":"look","state":"done"},{"type":"file","mediaType":"image/png","url":"data:image/png;base64,iVBORw0KGgo=","filename":"a.png"}]}`,
		`{"id":"u1","role":"user","parts":[{"type":"file","mediaType":"application/pdf","url":"https://example.com/a.pdf"},{"type":"data-note","id":"n","data":{"x":1}}]}`,
		`{"id":"u1","role":"user","parts":[{"type":"file","mediaType":"text/plain","url":"data:text/plain;base64,aGk="}]}`,
		`{"id":"u1","role":"user","parts":[{"type":"file","mediaType":"image/png","url":"data:image/jpeg;base64,AA=="}]}`,
		`{"id":"a1","role":"assistant","parts":[{"type":"step-start"},{"type":"reasoning","text":"hm"},{"type":"tool-x","toolCallId":"c1","state":"approval-responded","input":{},"approval":{"id":"ap","approved":false,"reason":"no"}}]}`,
		`{"id":"a1","role":"assistant","parts":[{"type":"dynamic-tool","toolName":"t","toolCallId":"c","state":"output-error","input":null,"errorText":"boom"},{"type":"source-url","sourceId":"s","url":"u"},{"type":"source-document","sourceId":"s","mediaType":"m","title":"t"}]}`,
		`{"id":"a1","role":"assistant","parts":[{"type":"tool-x","toolCallId":"c","state":"output-denied","approval":{"id":"a","approved":true}}]}`,
		`{"id":"u/1","role":"user","parts":[null,1,"x",{"type":null}]}`,
		`{"id":"s","role":"system","parts":[]}`,
	} {
		f.Add([]byte(seed))
	}
	codes := []string{CodeInvalidMessage, CodeUnsupportedFileType, CodeUserRequired, CodeMessageTooLarge, CodeReservedMessageID}
	lim := Limits{MaxBytes: 4 << 10, MaxParts: 8}
	f.Fuzz(func(t *testing.T, body []byte) {
		var m Message
		if json.Unmarshal(body, &m) != nil {
			return // the handler refuses what does not decode (invalid_message) before the validator sees it
		}
		err := ValidateIncoming(m, lim)
		if err != nil {
			var ae *Error
			if !errors.As(err, &ae) || (ae.Kind != KindInvalid && ae.Kind != KindTooLarge) || !slices.Contains(codes, ae.Code) {
				t.Fatalf("refusal %#v", err)
			}
			if !strings.HasPrefix(ae.Message, "parts[") && !strings.Contains(ae.Message, "message") {
				t.Fatalf("refusal %q names neither a part nor the message", ae.Message)
			}
			return
		}
		again, merr := json.Marshal(m)
		var m2 Message
		if merr != nil || json.Unmarshal(again, &m2) != nil {
			t.Fatalf("an accepted message does not re-encode: %v", merr)
		}
		if err := ValidateIncoming(m2, lim); err != nil {
			t.Fatalf("accepted %s, but not its re-encoding %s: %v", body, again, err)
		}
		if m.Role != RoleUser {
			return
		}
		for _, raw := range m.Parts {
			var p struct{ Type, MediaType, URL string }
			if json.Unmarshal(raw, &p) != nil || !userType(p.Type) {
				t.Fatalf("a user message was accepted with part %s", raw)
			}
			if p.Type == "file" && CheckModelFile(p.MediaType, p.URL) != nil {
				t.Fatalf("a user file the model cannot read was accepted: %s", raw)
			}
		}
	})
}

// ParseDataURL takes exactly data:<type>[;params];base64,<standard base64>.
func TestParseDataURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url, mediaType string
		n              int
		ok             bool
	}{
		{"data:image/png;base64,AAAA", "image/png", 3, true},
		{"data:application/pdf;name=a.pdf;base64,AA==", "application/pdf", 1, true},
		{"data:;base64,AA==", "", 1, true},
		{"data:image/png,AAAA", "", 0, false},
		{"data:image/png;base64", "", 0, false},
		{"data:image/png;base64,AA=", "", 0, false},
		{"data:image/png;base64,A-_A", "", 0, false},
		{"https://example.com/a.png", "", 0, false},
	}
	for _, tt := range tests {
		mt, data, ok := ParseDataURL(tt.url)
		if mt != tt.mediaType || len(data) != tt.n || ok != tt.ok {
			t.Errorf("ParseDataURL(%q) = %q, %d bytes, %v; want %q, %d, %v", tt.url, mt, len(data), ok, tt.mediaType, tt.n, tt.ok)
		}
	}
}

// The boundary's cost for a message near the default size limit: text and a PNG as a 1.5 MiB data URL (the
// base64 is decoded once to check it).
func BenchmarkValidateIncoming(b *testing.B) {
	img := `{"type":"file","mediaType":"image/png","filename":"a.png","url":"data:image/png;base64,` +
		strings.Repeat("iVBORw0K", (3<<19)/8) + `"}`
	m := Message{ID: "u1", Role: RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"what is this?"}`), json.RawMessage(img)}}
	b.SetBytes(int64(len(img)))
	b.ReportAllocs()
	for b.Loop() {
		if err := ValidateIncoming(m, Limits{MaxBytes: 2 << 20, MaxParts: 100}); err != nil {
			b.Fatal(err)
		}
	}
}

// REVIEW D13: a tool call's idempotency key names its assistant message, so the same call id in another message
// (a model that derives ids from its request, or a thread created again on a deleted one's id) is another call.
func TestIdempotencyKeyNamesTheMessage(t *testing.T) {
	if IdempotencyKey("th", "m1", "c1") == IdempotencyKey("th", "m2", "c1") {
		t.Fatal("one key for the same call id in two messages")
	}
	if IdempotencyKey("th", "m1", "c1") != IdempotencyKey("th", "m1", "c1") {
		t.Fatal("the key of one call is not stable")
	}
}
