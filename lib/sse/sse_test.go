package sse

import (
	"bufio"
	"bytes"
	"io"
	"reflect"
	"strings"
	"testing"
)

// scannerEvents splits events as bufio.Scanner's lines split them: the reference Reader is held to.
func scannerEvents(body string) (events []string, err error) {
	scn := bufio.NewScanner(strings.NewReader(body))
	scn.Buffer(nil, MaxLine)
	var data []byte
	for scn.Scan() {
		line := scn.Bytes()
		if len(line) == 0 {
			if len(data) > 0 {
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

func readerEvents(body string) (events []string, err error) {
	r := NewReader(io.NopCloser(strings.NewReader(body)))
	for {
		data, ok := r.Next()
		if !ok {
			return events, r.Err()
		}
		events = append(events, string(data))
	}
}

var bodies = []string{
	"data: {\"a\":1}\n\ndata: [DONE]\n\n",
	"data:{}\r\n\r\n: a comment\n\nevent: message\nid: 3\nretry: 10\ndata: {\"b\":\ndata: 2}\n\n",
	"\n\n\ndata: 1\n\ndata: 2",                            // the last event never ends
	"data: " + strings.Repeat("x", 3*ReadBuffer) + "\n\n", // a line longer than the buffer
	"data: " + strings.Repeat("y", 3*ReadBuffer) + "\r\n\r\n",
	"data: 1\n\n" + strings.Repeat("z", 2*ReadBuffer),
	"",
}

// Events are split and end as bufio.Scanner's lines split and ended them.
func TestReaderSplitsEvents(t *testing.T) {
	t.Parallel()
	for i, body := range bodies {
		ours, oursErr := readerEvents(body)
		want, wantErr := scannerEvents(body)
		if !reflect.DeepEqual(ours, want) || (oursErr == nil) != (wantErr == nil) {
			t.Fatalf("body %d %q:\nours %q (%v)\nwant %q (%v)", i, body, ours, oursErr, want, wantErr)
		}
	}
}

func FuzzReader(f *testing.F) {
	for _, body := range bodies {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		ours, oursErr := readerEvents(body)
		want, wantErr := scannerEvents(body)
		if !reflect.DeepEqual(ours, want) || (oursErr == nil) != (wantErr == nil) {
			t.Fatalf("body %q:\nours %q (%v)\nwant %q (%v)", body, ours, oursErr, want, wantErr)
		}
	})
}

// Ready says whether the next event is wholly in the buffer: not for half an event, yes once its empty line is in.
func TestReady(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	r := NewReader(pr)
	go pw.Write([]byte("data: 1\n\ndata: 2\n"))
	if data, ok := r.Next(); !ok || string(data) != "1\n" {
		t.Fatalf("first event %q %v", data, ok)
	}
	if r.Ready() {
		t.Fatal("ready with half of the next event in the buffer")
	}
	go pw.Write([]byte("\n"))
	if data, ok := r.Next(); !ok || string(data) != "2\n" {
		t.Fatalf("second event %q %v", data, ok)
	}
	pw.Close()
	if _, ok := r.Next(); ok || r.Err() != nil || !r.Ready() {
		t.Fatalf("after the end: err %v, ready %v", r.Err(), r.Ready())
	}
}
