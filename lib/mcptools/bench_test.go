package mcptools_test

import (
	"testing"

	"github.com/agentloop/agentloop/lib/mcptools"
)

// BenchmarkCall is what an MCP tool adds to a step (issue 19, "Numbers"): one call of echo against the Go SDK's
// server in-process over Streamable HTTP (httptest, loopback), stateless and session-based. cached: the listing
// is cached and the server's session open, as every call after a process's first; cold: a new process's first
// call, which connects and lists first (the listing a turn makes before its model request, then the call).
func BenchmarkCall(b *testing.B) {
	for _, stateless := range []bool{true, false} {
		name := map[bool]string{true: "stateless", false: "sessions"}[stateless]
		srv := &server{}
		hs := srv.start(b, stateless)
		b.Run(name+"/cached", func(b *testing.B) {
			tool := byName(b, sources(b, hs.URL, docsFile, mcptools.Options{})[0])["docs__echo"]
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := invoke(tool, `{"text":"hi"}`, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(name+"/cold", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				src := sources(b, hs.URL, docsFile, mcptools.Options{})[0]
				if _, err := invoke(byName(b, src)["docs__echo"], `{"text":"hi"}`, ""); err != nil {
					b.Fatal(err)
				}
				src.Close()
			}
		})
	}
}
