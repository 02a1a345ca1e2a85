package openai

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
)

// fileServer serves /report.pdf (pdf, as a PDF) over TLS as a remote host would, and 404 for the rest (an expired
// pre-signed URL). The download rules' own cases are lib/modelfiles'.
func fileServer(t *testing.T, pdf []byte) *httptest.Server {
	t.Helper()
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/report.pdf" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/pdf")
		w.Write(pdf)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func dataURL(mediaType string, n int) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, n))
}

// Files reach the offline model as the content parts Chat Completions takes, and its /received reply (one line
// per part it received) proves they were accepted as sent: images by URL or data URL as they are, PDFs as
// file_data, a PDF named by https URL downloaded first.
func TestFiles(t *testing.T) {
	t.Parallel()
	pdf := append([]byte("%PDF-1.7"), bytes.Repeat([]byte("%PDF"), 298)...)
	files := fileServer(t, pdf)
	images := imageHost(t)
	tests := []struct {
		name  string
		text  string
		files []agent.ModelFile
		want  string
		// wantData: the file_data the adapter sent for the first file part, when there is one
		wantData string
	}{
		{"image data URL", "/received", []agent.ModelFile{{MediaType: "image/png", URL: dataURL("image/png", 68)}},
			"text\nimage_url image/png 68 bytes", ""},
		{"image https URL", "/received", []agent.ModelFile{{MediaType: "image/png", URL: images.URL + "/cat.png"}},
			"text\nimage_url " + images.URL + "/cat.png", ""},
		{"PDF data URL", "/received", []agent.ModelFile{{MediaType: "application/pdf", URL: dataURL("application/pdf", 1234), Filename: "report.pdf"}},
			"text\nfile application/pdf report.pdf 1234 bytes", dataURL("application/pdf", 1234)},
		{"PDF https URL, downloaded", "/received", []agent.ModelFile{{MediaType: "application/pdf", URL: files.URL + "/report.pdf", Filename: "report.pdf"}},
			"text\nfile application/pdf report.pdf 1200 bytes", "data:application/pdf;base64," + base64.StdEncoding.EncodeToString(pdf)},
		{"PDF without a filename", "/received", []agent.ModelFile{{MediaType: "application/pdf", URL: dataURL("application/pdf", 3)}},
			"text\nfile application/pdf document.pdf 3 bytes", dataURL("application/pdf", 3)},
		{"several, after the text", "/received", []agent.ModelFile{
			{MediaType: "image/webp", URL: dataURL("image/webp", 10)},
			{MediaType: "application/pdf", URL: dataURL("application/pdf", 5), Filename: "a.pdf"},
			{MediaType: "image/gif", URL: dataURL("image/gif", 1)},
		}, "text\nimage_url image/webp 10 bytes\nfile application/pdf a.pdf 5 bytes\nimage_url image/gif 1 bytes", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, offline.WithFileClient(images.Client()))
			m := f.model(func(c *Config) { c.FileClient = files.Client() })
			req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: tt.text, Files: tt.files}}}
			_, events, err := run(context.Background(), m, req)
			if err != nil {
				t.Fatal(err)
			}
			if got := textOf(events, agent.EventTextDelta); got != tt.want {
				t.Fatalf("the model received %q, want %q", got, tt.want)
			}
			if tt.wantData == "" {
				return
			}
			content := f.LastBody(t)["messages"].([]any)[0].(map[string]any)["content"].([]any)
			for _, p := range content {
				if p := p.(map[string]any); p["type"] == "file" {
					if got := p["file"].(map[string]any)["file_data"]; got != tt.wantData {
						t.Fatalf("file_data %.80q…, want %.80q…", got, tt.wantData)
					}
					return
				}
			}
			t.Fatalf("no file part in %v", content)
		})
	}
}

// A PDF that cannot be downloaded fails the call before the model is asked (the download rules and their
// messages: lib/modelfiles).
func TestFileDownloadFails(t *testing.T) {
	t.Parallel()
	files := fileServer(t, bytes.Repeat([]byte("x"), 100))
	f := setup(t)
	m := f.model(func(c *Config) { c.FileClient = files.Client() })
	req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "/received",
		Files: []agent.ModelFile{{MediaType: "application/pdf", URL: files.URL + "/missing.pdf"}}}}}
	_, _, err := run(context.Background(), m, req)
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "a file could not be downloaded (HTTP 404)")
	if f.Requests() != 0 {
		t.Fatalf("the model was asked %d times", f.Requests())
	}
}

// A file the provider would refuse is refused by the offline model exactly as OpenAI words it, and the adapter
// reports it like any 400.
func TestInvalidFileRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		file agent.ModelFile
		why  string
	}{
		{"image data URL of text", agent.ModelFile{MediaType: "image/png", URL: dataURL("text/plain", 3)},
			"Invalid image URL: 'messages[0].content[1].image_url.url'. Expected a base64-encoded data URL with an image MIME type (e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got unsupported MIME type 'text/plain'."},
		{"image data URL, bad base64", agent.ModelFile{MediaType: "image/png", URL: "data:image/png;base64,@@"},
			"but got an invalid base64-encoded value"},
		{"PDF data URL, empty", agent.ModelFile{MediaType: "application/pdf", URL: "data:application/pdf;base64,"},
			"Invalid file data: 'messages[0].content[1].file.file_data'. Expected a base64-encoded data URL with an application/pdf MIME type (e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got empty base64-encoded bytes."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "/received", Files: []agent.ModelFile{tt.file}}}}
			_, _, err := run(context.Background(), f.model(nil), req)
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.why)
			if f.Requests() != 1 {
				t.Fatalf("requests = %d, want 1 (a 400 is not retried)", f.Requests())
			}
		})
	}
}

// A run's steps send the same history again: a PDF downloaded for one call is not downloaded for the next.
func TestFileDownloadedOnce(t *testing.T) {
	t.Parallel()
	var gets atomic.Int32
	files := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		w.Header().Set("Content-Type", "application/pdf")
		w.Write([]byte("%PDF-1.7 " + r.URL.Path))
	}))
	t.Cleanup(files.Close)
	f := setup(t)
	m := f.model(func(c *Config) { c.FileClient = files.Client() })
	for _, path := range []string{"/a.pdf", "/a.pdf", "/b.pdf", "/a.pdf"} {
		req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "/received",
			Files: []agent.ModelFile{{MediaType: "application/pdf", URL: files.URL + path, Filename: "x.pdf"}}}}}
		_, events, err := run(context.Background(), m, req)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := textOf(events, agent.EventTextDelta), fmt.Sprintf("text\nfile application/pdf x.pdf %d bytes", len("%PDF-1.7 "+path)); got != want {
			t.Fatalf("%s: the model received %q, want %q", path, got, want)
		}
	}
	if gets.Load() != 2 {
		t.Fatalf("%d downloads for two files", gets.Load())
	}
	// The result says what was downloaded, by URL, so that the transcript budgets it by its size (REVIEW S5).
	req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "hi",
		Files: []agent.ModelFile{{MediaType: "application/pdf", URL: files.URL + "/b.pdf"}}}}}
	res, _, err := run(context.Background(), m, req)
	if want := int64(len("%PDF-1.7 /b.pdf")); err != nil || res.FileBytes[files.URL+"/b.pdf"] != want {
		t.Fatalf("result %+v (%v), want %d bytes for b.pdf", res, err, want)
	}
}

// REVIEW S4: an older message's PDF that can no longer be downloaded (an expired pre-signed URL: 404) failed every
// later request of the thread. It is a line saying so now; the newest message's own file still fails the call,
// with a message that says why.
func TestOlderFileUnavailable(t *testing.T) {
	t.Parallel()
	files := fileServer(t, []byte("%PDF-1.7 report"))
	f := setup(t)
	m := f.model(func(c *Config) { c.FileClient = files.Client() })
	gone := agent.ModelFile{MediaType: "application/pdf", URL: files.URL + "/expired.pdf?X-Amz-Signature=secret", Filename: "q3.pdf"}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "read this", Files: []agent.ModelFile{gone}},
		{Role: "assistant", Text: "done"},
		{Role: "user", Text: "and now?"},
	}}
	_, events, err := run(context.Background(), m, req)
	if err != nil {
		t.Fatalf("a turn over an older file that is gone: %v", err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "You said: and now?" {
		t.Fatalf("reply %q", got)
	}
	first := f.LastBody(t)["messages"].([]any)[0].(map[string]any)["content"]
	if s := fmt.Sprint(first); !strings.Contains(s, "[attachment q3.pdf (application/pdf) no longer available]") || strings.Contains(s, "secret") {
		t.Fatalf("the older message sent: %v", first)
	}
	req.Messages = append(req.Messages, agent.ModelMessage{Role: "assistant", Text: "ok"},
		agent.ModelMessage{Role: "user", Text: "/received", Files: []agent.ModelFile{gone}})
	_, _, err = run(context.Background(), m, req)
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "a file could not be downloaded (HTTP 404)")
}

// One request carries at most MaxRequestFileBytes of files: the older messages' files beyond it (newest kept
// first) become a line; the newest message's own files over it fail the call.
func TestRequestFileBytesBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.MaxRequestFileBytes = 2500 })
	pdf := func(name string, n int) agent.ModelFile {
		return agent.ModelFile{MediaType: "application/pdf", URL: dataURL("application/pdf", n), Filename: name}
	}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "one", Files: []agent.ModelFile{pdf("old.pdf", 1000)}},
		{Role: "assistant", Text: "ok"},
		{Role: "user", Text: "two", Files: []agent.ModelFile{pdf("mid.pdf", 1000)}},
		{Role: "assistant", Text: "ok"},
		{Role: "user", Text: "/received", Files: []agent.ModelFile{pdf("new.pdf", 1000)}},
	}}
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	msgs := f.LastBody(t)["messages"].([]any)
	if s := fmt.Sprint(msgs[0]); !strings.Contains(s, "[attachment old.pdf (application/pdf) not shown: the request's files are over") {
		t.Fatalf("the oldest file was sent: %.300s", s)
	}
	if s := fmt.Sprint(msgs[2]); !strings.Contains(s, "file_data") {
		t.Fatalf("the middle file was not sent: %.300s", s)
	}
	req.Messages[4].Files = append(req.Messages[4].Files, pdf("new2.pdf", 1000), pdf("new3.pdf", 1000))
	_, _, err := run(context.Background(), m, req)
	requireError(t, err, agent.KindTooLarge, agent.CodeMessageTooLarge, "the message's files are over 2500 bytes in all")
}

// pngFile starts as a PNG does.
var pngFile = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")

// imageHost serves /cat.png (a PNG), /cat-label.png (a PNG labelled image/jpeg), /page.png (an HTML page labelled
// image/png) and 404 for the rest (an expired pre-signed URL), over TLS.
func imageHost(t *testing.T) *httptest.Server {
	t.Helper()
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/cat.png":
			w.Header().Set("Content-Type", "image/png")
			w.Write(pngFile)
		case "/cat-label.png":
			w.Header().Set("Content-Type", "image/jpeg")
			w.Write(pngFile)
		case "/page.png":
			w.Header().Set("Content-Type", "image/png")
			w.Write([]byte("<!DOCTYPE html><html><body>sign in</body></html>"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

// Issue 16 item 4: an older message's image named by https URL was sent as that URL for the provider to fetch; once
// the URL was gone (an expired pre-signed URL: 404) the provider refused every later request of the thread with
// HTTP 400 invalid_image_url. The adapter downloads an older message's https image itself now: one that downloads
// is sent as a data URL (of the type its bytes are), one that does not, or that is no image, becomes a line. The
// newest message's image is still sent as its URL, and the provider's refusal of it fails the call.
func TestOlderImageUnavailable(t *testing.T) {
	t.Parallel()
	host := imageHost(t)
	f := setup(t, offline.WithFileClient(host.Client()))
	m := f.model(func(c *Config) { c.FileClient = host.Client() })
	gone := agent.ModelFile{MediaType: "image/png", URL: host.URL + "/expired.png?X-Amz-Signature=secret", Filename: "chart.png"}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "look", Files: []agent.ModelFile{gone,
			{MediaType: "image/png", URL: host.URL + "/cat.png", Filename: "cat.png"},
			{MediaType: "image/png", URL: host.URL + "/cat-label.png"},
			{MediaType: "image/png", URL: host.URL + "/page.png", Filename: "page.png"}}},
		{Role: "assistant", Text: "a chart and a cat"},
		{Role: "user", Text: "and now?"},
	}}
	_, events, err := run(context.Background(), m, req)
	if err != nil {
		t.Fatalf("a turn over an older image that is gone: %v", err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "You said: and now?" {
		t.Fatalf("reply %q", got)
	}
	first := fmt.Sprint(f.LastBody(t)["messages"].([]any)[0].(map[string]any)["content"])
	png := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngFile)
	for _, want := range []string{"[attachment chart.png (image/png) no longer available]", "[attachment page.png (image/png) no longer available]"} {
		if !strings.Contains(first, want) {
			t.Fatalf("the older message sent %s\nwithout %q", first, want)
		}
	}
	if strings.Count(first, png) != 2 || strings.Contains(first, "secret") || strings.Contains(first, host.URL) {
		t.Fatalf("the older message sent %s\nwant cat.png twice as %s, and no URL", first, png)
	}

	// The newest message's image goes as its URL: the provider fetches it, and refuses it when it is gone.
	req.Messages = append(req.Messages, agent.ModelMessage{Role: "assistant", Text: "ok"},
		agent.ModelMessage{Role: "user", Text: "/received", Files: []agent.ModelFile{{MediaType: "image/png", URL: host.URL + "/cat.png"}}})
	_, events, err = run(context.Background(), m, req)
	if got := textOf(events, agent.EventTextDelta); err != nil || got != "text\nimage_url "+host.URL+"/cat.png" {
		t.Fatalf("the newest image: %q (%v)", got, err)
	}
	// Its image that is gone is the person's own error, said with a code of its own (it was model_error, as if the
	// provider had failed), in words that name no URL.
	req.Messages[len(req.Messages)-1].Files = []agent.ModelFile{gone}
	_, _, err = run(context.Background(), m, req)
	requireError(t, err, agent.KindInvalid, agent.CodeFileUnavailable, "Error while downloading")
	if code, msg := agent.Public(err); msg != "the model provider could not read an image of the message (HTTP 400)" || strings.Contains(err.Error(), "secret") {
		t.Fatalf("public (%s, %q)", code, msg)
	}
}

// The older images the adapter downloads count against MaxRequestFileBytes like PDFs: beyond it (newest kept
// first) they become a line.
func TestOlderImagesCountInTheRequestBytes(t *testing.T) {
	t.Parallel()
	host := imageHost(t)
	f := setup(t, offline.WithFileClient(host.Client()))
	m := f.model(func(c *Config) { c.FileClient, c.MaxRequestFileBytes = host.Client(), int64(len(pngFile))+10 })
	img := func(name string) agent.ModelFile {
		return agent.ModelFile{MediaType: "image/png", URL: host.URL + "/cat.png?" + name, Filename: name}
	}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "one", Files: []agent.ModelFile{img("old.png")}},
		{Role: "assistant", Text: "ok"},
		{Role: "user", Text: "two", Files: []agent.ModelFile{img("mid.png")}},
		{Role: "assistant", Text: "ok"},
		{Role: "user", Text: "three"},
	}}
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	msgs := f.LastBody(t)["messages"].([]any)
	if s := fmt.Sprint(msgs[0]); !strings.Contains(s, "[attachment old.png (image/png) not shown: the request's files are over") {
		t.Fatalf("the oldest image was sent: %.300s", s)
	}
	if s := fmt.Sprint(msgs[2]); !strings.Contains(s, "data:image/png;base64,") {
		t.Fatalf("the middle image was not sent: %.300s", s)
	}
}
