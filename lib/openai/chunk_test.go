package openai

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

// normal clears what only the decoders' bookkeeping differs in: an empty array and none are alike to the
// adapter.
func normal(c chunk) chunk {
	if len(c.Choices) == 0 {
		c.Choices = nil
	}
	for i := range c.Choices {
		if len(c.Choices[i].Delta.ToolCalls) == 0 {
			c.Choices[i].Delta.ToolCalls = nil
		}
	}
	return c
}

// checkAgrees fails when decodeChunk accepts data and reads it otherwise than encoding/json does (or
// decodeChunkSlow refuses it, or finds an error event in it); it reports whether decodeChunk accepted it.
func checkAgrees(t *testing.T, data []byte) bool {
	t.Helper()
	fast := chunk{Model: "m", Choices: make([]chunkChoice, 0, 4)} // as after an earlier chunk
	if !decodeChunk(data, &fast) {
		return false
	}
	want, err := decodeChunkSlow(data)
	if err != nil {
		t.Fatalf("decodeChunk accepted %q, which encoding/json refuses: %v", data, err)
	}
	if got := normal(fast); !reflect.DeepEqual(got, normal(want)) {
		t.Fatalf("decodeChunk read %q as\n%+v\nencoding/json as\n%+v", data, got, normal(want))
	}
	return true
}

const chunkHead = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","system_fingerprint":"fp_1",`

// chunkCases are chunks as providers send them (fast: decodeChunk reads them itself) and inputs it must leave to
// encoding/json.
var chunkCases = []struct {
	name string
	data string
	fast bool
}{
	{"role", chunkHead + `"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}`, true},
	{"word", chunkHead + `"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}` + "\n", true},
	{"escapes", chunkHead + `"choices":[{"index":0,"delta":{"content":"a \"q\"\n\u00e9\ud83d\ude00\/"},"finish_reason":null}]}`, true},
	{"unicode", chunkHead + `"choices":[{"index":0,"delta":{"content":"héllo 世界 😀"}}]}`, true},
	{"not utf-8", chunkHead + "\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\xffb\"}}]}", true},
	{"reasoning as an object", `{"choices":[{"index":0,"delta":{"reasoning":{"text":"x"},"reasoning_content":null}}]}`, true},
	{"lone surrogate", chunkHead + `"choices":[{"index":0,"delta":{"content":"\ud800x"}}]}`, true},
	{"finish", chunkHead + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`, true},
	{"usage", chunkHead + `"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":200,"total_tokens":220,"prompt_tokens_details":{"cached_tokens":4,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":7,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}`, true},
	{"usage null", chunkHead + `"choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}`, true},
	{"usage details null", chunkHead + `"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":null,"completion_tokens_details":null}}`, true},
	{"usage without total", chunkHead + `"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`, true},
	{"tool call start", chunkHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"add_note","arguments":""}}]},"finish_reason":null}]}`, true},
	{"tool call fragment", chunkHead + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"text\":"}}]}}]}`, true},
	{"tool calls null", chunkHead + `"choices":[{"index":0,"delta":{"content":null,"tool_calls":null,"function_call":null}}]}`, true},
	{"reasoning_content", chunkHead + `"choices":[{"index":0,"delta":{"reasoning_content":"Thinking"}}]}`, true},
	{"reasoning", chunkHead + `"choices":[{"index":0,"delta":{"reasoning":"Thinking","reasoning_content":null}}]}`, true},
	{"two choices", chunkHead + `"choices":[{"index":1,"delta":{"content":"b"}},{"index":0,"delta":{"content":"a"}}]}`, true},
	{"no model", `{"choices":[{"delta":{"content":"a"}}]}`, true},
	{"model null", `{"model":null,"choices":null}`, true},
	{"a new model", `{"model":"gpt-4o-mini-2024-07-18","choices":[]}`, true},
	{"unknown fields of every kind", `{"x":[1,-2.5e+3,true,false,null,{"y":"z\u0041"}],"model":"m","choices":[{"index":0,"delta":{"content":"a","extra":{}},"z":0}]}`, true},
	{"white space", " {\n\t\"model\" : \"m\" ,\r\n \"choices\" : [ { \"index\" : 0 , \"delta\" : { \"content\" : \"a\" } } ] }\n", true},
	{"empty object", `{}`, true},
	{"delta null", `{"choices":[{"index":0,"delta":null}]}`, true},
	{"negative zero index", `{"choices":[{"index":-0,"delta":{"content":"a"}}]}`, true},

	{"error event", `{"error":{"message":"boom","code":500}}`, false},
	{"error null", `{"error":null,"choices":[]}`, false},
	{"key in another case", `{"Model":"m","choices":[]}`, false},
	{"escaped key", `{"mod\u0065l":"m","choices":[]}`, false},
	{"repeated delta", `{"choices":[{"delta":{"content":"a"},"delta":{"refusal":"b"}}]}`, false},
	{"repeated choices", `{"choices":[{"delta":{"content":"a"}}],"choices":[]}`, false},
	{"index as a string", `{"choices":[{"index":"0","delta":{"content":"a"}}]}`, false},
	{"index with a fraction", `{"choices":[{"index":0.0,"delta":{"content":"a"}}]}`, false},
	{"usage as floats", `{"choices":[],"usage":{"prompt_tokens":10.0,"completion_tokens":2}}`, false},
	{"error in another case", `{"Error":{"message":"boom"}}`, false},
	{"index with an exponent", `{"choices":[{"index":1e0,"delta":{"content":"a"}}]}`, false},
	{"huge index", `{"choices":[{"index":99999999999999999999,"delta":{"content":"a"}}]}`, false},
	{"content as a number", `{"choices":[{"index":0,"delta":{"content":5}}]}`, false},
	{"choice null", `{"choices":[null]}`, false},
	{"tool call null", `{"choices":[{"delta":{"tool_calls":[null]}}]}`, false},
	{"choices an object", `{"choices":{}}`, false},
	{"array", `[]`, false},
	{"null", `null`, false},
	{"trailing comma", `{"choices":[],}`, false},
	{"trailing data", `{"choices":[]} x`, false},
	{"cut short", `{"choices":[{"index":0,"delta":{"content":"a`, false},
	{"leading zero", `{"choices":[{"index":01}]}`, false},
	{"bad escape", `{"choices":[{"delta":{"content":"\x"}}]}`, false},
	{"control character", "{\"choices\":[{\"delta\":{\"content\":\"a\tb\"}}]}", false},
	{"bad literal", `{"x":nul,"choices":[]}`, false},
	{"bad number", `{"x":-,"choices":[]}`, false},
	{"deep", `{"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, false},
	{"empty", ``, false},
}

// TestChunkDecoderAgrees: the adapter's own decoder reads the chunks providers send, and reads them as
// encoding/json does; what it does not read goes to encoding/json.
func TestChunkDecoderAgrees(t *testing.T) {
	t.Parallel()
	for _, tt := range chunkCases {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkAgrees(t, []byte(tt.data)); got != tt.fast {
				t.Fatalf("decodeChunk accepted = %t, want %t", got, tt.fast)
			}
		})
	}
}

func FuzzChunkDecoder(f *testing.F) {
	for _, tt := range chunkCases {
		f.Add([]byte(tt.data))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkAgrees(t, data) })
}

// scannerEvents is how the adapter split events before chunkStream read them itself (bufio.Scanner lines):
// the reference chunkStream is held to.
func scannerEvents(body string) (events []string, err error) {
	scn := bufio.NewScanner(strings.NewReader(body))
	scn.Buffer(nil, maxEventLine)
	var data []byte
	for scn.Scan() {
		line := scn.Bytes()
		if len(line) == 0 {
			if len(data) > 0 {
				if bytes.HasPrefix(data, []byte("[DONE]")) {
					return events, nil
				}
				events = append(events, string(data))
				data = nil
			}
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if string(name) != "data" {
			continue
		}
		data = append(append(data, bytes.TrimPrefix(value, []byte(" "))...), '\n')
	}
	return events, scn.Err()
}

// streamEvents reads body through chunkStream and through scannerEvents and encoding/json.
func streamEvents(body string) (ours, want []string) {
	s := newChunkStream(io.NopCloser(strings.NewReader(body)))
	for s.Next() {
		ours = append(ours, fmt.Sprintf("%+v", normal(s.Current())))
	}
	ours = append(ours, fmt.Sprint("end: ", s.Err()))
	events, err := scannerEvents(body)
	for _, ev := range events {
		c, cerr := decodeChunkSlow([]byte(ev))
		if cerr != nil {
			err = cerr
			break
		}
		want = append(want, fmt.Sprintf("%+v", normal(c)))
	}
	want = append(want, fmt.Sprint("end: ", err))
	return ours, want
}

var streamCases = []string{
	"data: {\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
	"data:{\"choices\":[]}\r\n\r\n: a comment\n\nevent: message\nid: 3\nretry: 10\ndata: {\"choices\":\ndata: [{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]",
	"\n\n\ndata: {\"choices\":[]}\n\ndata: {\"choices\":[]}",                        // the last event never ends
	"data: {\"choices\":[]}\n\ndata: [DONE] and more\n\ndata: {\"choices\":[]}\n\n", // nothing after [DONE]
	"data: {\"error\":{\"message\":\"overloaded\",\"code\":529}}\n\n",
	"data: {\"choices\":[{\"index\":\"0\"}]}\n\n",
	"data: {\"choices\":[}\n\n",
	"data: " + strings.Repeat("x", 3*chunkReadBuffer) + "\n\n",
	"data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("y", 3*chunkReadBuffer) + "\"}}]}\r\n\r\n",
	"data: {\"choices\":[]}\n\n" + strings.Repeat("z", 2*chunkReadBuffer),
	"",
}

// TestChunkStreamSplitsEvents: events are split and end as bufio.Scanner's lines split and ended them.
func TestChunkStreamSplitsEvents(t *testing.T) {
	t.Parallel()
	for i, body := range streamCases {
		if ours, want := streamEvents(body); !reflect.DeepEqual(ours, want) {
			t.Fatalf("body %d %q:\nours %q\nwant %q", i, body, ours, want)
		}
	}
}

func FuzzChunkStream(f *testing.F) {
	for _, body := range streamCases {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if ours, want := streamEvents(body); !reflect.DeepEqual(ours, want) {
			t.Fatalf("body %q:\nours %q\nwant %q", body, ours, want)
		}
	})
}

// BenchmarkChunkDecode compares the adapter's decoder with encoding/json's (decodeChunkSlow) on a typical text
// chunk.
func BenchmarkChunkDecode(b *testing.B) {
	data := []byte(chunkHead + `"choices":[{"index":0,"delta":{"content":"w1a2b3c "},"logprobs":null,"finish_reason":null}]}` + "\n")
	b.Run("decodeChunk", func(b *testing.B) {
		var c chunk
		b.ReportAllocs()
		for b.Loop() {
			if !decodeChunk(data, &c) {
				b.Fatal("refused")
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeChunkSlow(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
