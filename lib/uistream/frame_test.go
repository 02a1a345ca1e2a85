package uistream

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestAppendString(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{`q"b\`, `"q\"b\\"`},
		{"\n\r\t\x00\x1f", `"\n\r\t\u0000\u001f"`},
		{"<&>", `"<&>"`},
		{"a\u2028b\u2029c", `"a\u2028b\u2029c"`},
		{"ü🚀", `"ü🚀"`},
		{"bad\xffbyte", `"bad\ufffdbyte"`},
	}
	for _, tt := range tests {
		if got := string(appendString(nil, tt.in)); got != tt.want {
			t.Errorf("appendString(%q) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

// appendString must decode to what encoding/json would produce for any input, including invalid UTF-8, and
// never emit a raw newline (a frame must stay on one line).
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\nb", "\xff", "\u2028", `"\`, "🚀\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := appendString(nil, s)
		if strings.ContainsAny(string(out), "\r\n") || !utf8.Valid(out) {
			t.Fatalf("appendString(%q) = %q: raw line break or invalid UTF-8", s, out)
		}
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("appendString(%q) = %s: %v", s, out, err)
		}
		ref, _ := json.Marshal(s)
		var want string
		_ = json.Unmarshal(ref, &want)
		if got != want {
			t.Fatalf("appendString(%q) decodes to %q, encoding/json to %q", s, got, want)
		}
	})
}

func TestParseFrames(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string
		chunks  int
		done    bool
		wantErr bool
	}{
		{"empty", "", 0, false, false},
		{"complete", "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n", 2, true, false},
		{"open stream", "data: {\"type\":\"start\"}\n\n", 1, false, false},
		{"partial frame", "data: {\"type\":\"start\"}\n\ndata: {\"ty", 1, false, true},
		{"missing prefix", "{\"type\":\"start\"}\n\n", 0, false, true},
		{"invalid json", "data: {\"type\"\n\n", 0, false, true},
		{"frame after done", "data: [DONE]\n\ndata: {}\n\n", 0, true, true},
		{"carriage return", "data: {}\r\n\n", 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chunks, done, err := ParseFrames([]byte(tt.body))
			if (err != nil) != tt.wantErr || len(chunks) != tt.chunks || done != tt.done {
				t.Errorf("ParseFrames = %d chunks, done=%v, err=%v; want %d, %v, error %v",
					len(chunks), done, err, tt.chunks, tt.done, tt.wantErr)
			}
		})
	}
}

func TestFrames(t *testing.T) {
	t.Parallel()
	b, err := Frames(Error{ErrorText: "stale"}, Finish{FinishReason: "error"})
	if err != nil {
		t.Fatal(err)
	}
	got := string(AppendDone(b))
	want := "data: {\"type\":\"error\",\"errorText\":\"stale\"}\n\ndata: {\"type\":\"finish\",\"finishReason\":\"error\"}\n\ndata: [DONE]\n\n"
	if got != want {
		t.Errorf("Frames = %q, want %q", got, want)
	}
	if _, err := Frames(Start{}, TextDelta{}); err == nil {
		t.Error("Frames accepted an invalid chunk")
	}
}
