package httpapi

import (
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
