package httpapi_test

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
)

// Ids that cannot name a thread, and cursors that no page gave, are refused before they reach the store (REVIEW
// S11: a DynamoDB key over its size limit is a ValidationException, a 500 and an alarm): a thread route answers
// 404 thread_not_found as for any thread it does not find, the resume route 204, a cursor 400 invalid_cursor.
func TestPathAndCursorIDsAreBounded(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			f := limitStack(t, store, func(*config.Config) {})
			alice := token(t, "alice")
			readAll(t, f.do(t, "POST", "/chat", alice, chatBody("th-1", "u1", "hello")))
			long := strings.Repeat("a", 2100)
			for _, c := range []struct{ method, path string }{
				{"GET", "/threads/" + long},
				{"PATCH", "/threads/" + long},
				{"DELETE", "/threads/" + long},
				{"POST", "/threads/" + long + "/stop"},
				{"GET", "/threads/" + long + "/runs"},
			} {
				var body any
				if c.method != "GET" && c.method != "DELETE" {
					body = map[string]any{}
				}
				resp := f.do(t, c.method, c.path, alice, body)
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("%s /threads/<2100 bytes>%s: %d %s, want 404", c.method, strings.TrimPrefix(c.path, "/threads/"+long), resp.StatusCode, readAll(t, resp))
					continue
				}
				if got := errorCode(t, resp); got != agent.CodeThreadNotFound {
					t.Errorf("%s: code %q, want %q", c.method, got, agent.CodeThreadNotFound)
				}
			}
			if resp := f.do(t, "GET", "/chat/"+long+"/stream", alice, nil); resp.StatusCode != http.StatusNoContent {
				t.Errorf("GET /chat/<2100 bytes>/stream: %d %s, want 204", resp.StatusCode, readAll(t, resp))
			}
			for _, list := range []struct{ path, kind string }{{"/threads/th-1", "m"}, {"/threads/th-1/runs", "r"}} {
				js, _ := json.Marshal(map[string]any{"l": list.kind, "s": 1, "t": 1, "i": strings.Repeat("x", 3000)})
				resp := f.do(t, "GET", list.path+"?cursor="+base64.RawURLEncoding.EncodeToString(js), alice, nil)
				if resp.StatusCode != http.StatusBadRequest {
					t.Errorf("GET %s with a 3000-byte cursor id: %d %s, want 400", list.path, resp.StatusCode, readAll(t, resp))
					continue
				}
				if got := errorCode(t, resp); got != agent.CodeInvalidCursor {
					t.Errorf("GET %s: code %q, want %q", list.path, got, agent.CodeInvalidCursor)
				}
			}
		})
	}
}
