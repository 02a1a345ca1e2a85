package toolschema_test

import (
	"testing"

	"github.com/agentloop/agentloop/lib/toolschema"
)

// BenchmarkCheckInput is what the input check adds to one tool call (issue 19 "Numbers": schema validation):
// valid JSON checked against a compiled schema, a violation explained, and malformed JSON repaired first. make
// bench runs it (its catch-all line, 2 s each).
func BenchmarkCheckInput(b *testing.B) {
	c, err := toolschema.New(noteTool)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct{ name, args string }{
		{"valid", `{"text":"buy milk","tags":["home","errands"],"priority":2}`},
		{"refused", `{"text":"","priority":9,"tags":[1]}`},
		{"repaired", `{'text': 'buy milk', tags: ['home'], priority: 2,}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = c.CheckInput(noteTool, bc.args)
			}
		})
	}
}
