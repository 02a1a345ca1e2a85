package httpapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// FuzzDecodeChat: no body makes decoding or validation panic, and every rejection is a 400/413-kind
// *agent.Error with a code. Run longer with: go test -fuzz FuzzDecodeChat ./lib/httpapi
func FuzzDecodeChat(f *testing.F) {
	for _, seed := range []string{
		`{"id":"t","trigger":"submit-message","messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"hi"}]}]}`,
		`{"id":"t","trigger":"regenerate-message","messageId":"a","messages":[]}`,
		`{"id":"t","trigger":"submit-message","messages":[{"id":"m","role":"assistant","parts":[{"type":"tool-x","toolCallId":"c","state":"output-available","output":{}}]}]}`,
		`{"id":"t","trigger":"submit-message","multitask":"interrupt","messages":[{"id":"m","role":"user","parts":[{"type":"file","url":"data:,x"}],"metadata":{"a":1}}]}`,
		`{"id":null}`, `[]`, `{"messages":[null]}`, `{"id":"t","trigger":"submit-message","messages":[{"parts":null}]}`,
		`{"id":"t","trigger":"submit-message","messages":[{"id":"m","role":"user","parts":[1,"x",null]}]}`, ``, `nul`,
		`{"id":"t","trigger":"submit-message","messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"see"},{"type":"file","mediaType":"image/png","url":"data:image/png;base64,iVBORw0KGgo=","filename":"a.png"}]}]}`,
		`{"id":"t","trigger":"submit-message","messages":[{"id":"m","role":"user","parts":[{"type":"file","mediaType":"application/pdf","url":"https://example.com/a.pdf"},{"type":"data-x","data":1}]}]}`,
		`{"id":"t","trigger":"submit-message","messages":[{"id":"m","role":"user","parts":[{"type":"text","text":"a","TYPE":"b"}]}]}`,
		`{"id":"t","trigger":"submit-message","messageId":"a","messages":[{"id":"a","role":"assistant","parts":[{"type":"step-start"},{"type":"tool-d","toolCallId":"c","state":"approval-responded","input":{},"approval":{"id":"p","approved":true}}]}]}`,
	} {
		f.Add(seed)
	}
	eng := engine.New(engine.Deps{}, engine.Config{MaxMessageBytes: 1 << 15})
	f.Fuzz(func(t *testing.T, body string) {
		req, err := decodeChat(strings.NewReader(body), 1<<16)
		if err == nil {
			err = eng.Validate(req)
		}
		if err == nil {
			if req.ThreadID == "" || (req.Kind == engine.TurnSubmit && req.Message == nil) {
				t.Fatalf("accepted an incomplete request: %+v", req)
			}
			if req.Kind != engine.TurnSubmit {
				return
			}
			// The engine's decoder reads every accepted part as the validator did (no field it matches
			// case-insensitively says otherwise).
			for _, raw := range req.Message.Parts {
				var fields map[string]json.RawMessage
				var typ string
				p, err := agent.DecodePart(raw)
				if err != nil || json.Unmarshal(raw, &fields) != nil || json.Unmarshal(fields["type"], &typ) != nil || typ != p.Type {
					t.Fatalf("accepted part %s: the validator read type %q, the engine %+v (%v)", raw, typ, p, err)
				}
			}
			return
		}
		if k := agent.KindOf(err); k != agent.KindInvalid && k != agent.KindTooLarge {
			t.Fatalf("rejection of kind %s: %v", k, err)
		}
		if agent.CodeOf(err) == agent.CodeInternal {
			t.Fatalf("rejection without a code: %v", err)
		}
	})
}
