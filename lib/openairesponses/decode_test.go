package openairesponses

import (
	"encoding/json"
	"reflect"
	"testing"
)

var decodeSeeds = []string{
	`{"type":"response.output_text.delta","item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello","logprobs":[],"obfuscation":"aB3","sequence_number":4}`,
	`{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","output_index":0,"summary_index":1,"delta":" world","sequence_number":9}`,
	`{"type":"response.function_call_arguments.delta","item_id":"fc_1","output_index":2,"delta":"{\"city\":","sequence_number":12}`,
	`{"type":"response.output_text.delta","delta":"line\nbreak \u00e9 ü","item_id":"m"}`,
	`{"type":"response.output_text.delta","delta":"a","Delta":"b"}`,
	`{"type":"response.output_text.delta","delta":"a","delta":"b"}`,
	`{"type":"response.output_text.delta","delta":"a","logprobs":[{"token":"a"}]}`,
	`{"type":"response.output_text.delta","summary_index":1.0,"delta":"x"}`,
	`{"type":"response.completed","response":{"status":"completed"}}`,
	`{"type":"error","code":"server_error","message":"boom"}`,
	`{"delta":"x","type":"response.refusal.delta"}`,
	` { "type" : "response.output_text.delta" , "delta" : "x" } `,
	`{"type":"response.output_text.delta","delta":null}`,
	`{"type":"response.output_text.delta","delta":"\xff"}`,
	`{"type":"response.output_text.delta","delta":"x"} trailing`,
}

// TestDecodeDelta: the fast path reads the per-word events, and leaves the rest to encoding/json.
func TestDecodeDelta(t *testing.T) {
	t.Parallel()
	for i, want := range []bool{true, true, true, true, false, false, false, false, false, false, true, true, false, false, false} {
		var ev event
		if got := decodeDelta([]byte(decodeSeeds[i]), &ev); got != want {
			t.Errorf("decodeDelta(%s) = %v, want %v", decodeSeeds[i], got, want)
		}
	}
}

// FuzzDecodeDelta holds the fast path to encoding/json: whatever it accepts decodes the same there.
func FuzzDecodeDelta(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast event
		if !decodeDelta(data, &fast) {
			return
		}
		var slow event
		if err := json.Unmarshal(data, &slow); err != nil {
			t.Fatalf("fast path accepted what encoding/json refuses (%v): %q", err, data)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("fast %+v, encoding/json %+v: %q", fast, slow, data)
		}
	})
}
