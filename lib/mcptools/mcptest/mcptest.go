// Package mcptest holds what tests of MCP tool sources share: running a case over both Streamable HTTP
// transports a server may offer.
package mcptest

import (
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EachTransport runs test, as a parallel subtest each, against a stateless server (the 2026-07-28 revision's
// way, a request at a time) and a session-based one.
func EachTransport(t *testing.T, test func(t *testing.T, stateless bool)) {
	t.Helper()
	for _, stateless := range []bool{true, false} {
		t.Run(map[bool]string{true: "stateless", false: "sessions"}[stateless], func(t *testing.T) {
			t.Parallel()
			test(t, stateless)
		})
	}
}

// Handler serves srv over Streamable HTTP, stateless or session-based.
func Handler(srv *mcp.Server, stateless bool) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: stateless})
}
