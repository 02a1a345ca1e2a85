package modelfiles

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// fileServer serves files over TLS as a remote host would: /report.pdf (a PDF), /page.html (text/html),
// /octet.pdf (application/octet-stream, not a PDF's bytes), /empty.pdf (200, no bytes), /slow.pdf (never answers
// within the test's timeout), /cat.png (a PNG), /cat-label.png (a PNG labelled image/jpeg), /page.png (an HTML
// page labelled image/png) and 404 for the rest. gets counts the requests.
func fileServer(t *testing.T, pdf []byte, gets *atomic.Int32) *httptest.Server {
	t.Helper()
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gets != nil {
			gets.Add(1)
		}
		switch r.URL.Path {
		case "/report.pdf":
			w.Header().Set("Content-Type", "application/pdf")
			w.Write(pdf)
		case "/page.html":
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html></html>"))
		case "/octet.pdf":
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Write([]byte("<html>not a PDF</html>"))
		case "/empty.pdf":
			w.Header().Set("Content-Type", "application/pdf")
		case "/slow.pdf":
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
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

// pngFile starts as a PNG does.
var pngFile = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")

var pdfFile = []byte("%PDF-1.7 report")

func dataURL(mediaType string, b []byte) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(b)
}

func user(text string, files ...agent.ModelFile) agent.ModelMessage {
	return agent.ModelMessage{Role: "user", Text: text, Files: files}
}

func requireError(t *testing.T, err error, kind agent.Kind, code, public string) {
	t.Helper()
	var ae *agent.Error
	if !errors.As(err, &ae) || ae.Kind != kind || ae.Code != code || !strings.Contains(ae.Message+" "+err.Error(), public) {
		t.Fatalf("err = %v, want %s/%s saying %q", err, kind, code, public)
	}
}

// Each file becomes what the provider is sent: data URLs and the newest message's images by URL as they are, PDFs
// by URL downloaded (their decoded sizes reported), older images by URL downloaded as the type their bytes are.
func TestResolve(t *testing.T) {
	t.Parallel()
	host := fileServer(t, pdfFile, nil)
	r := New(Config{Client: host.Client()})
	pdfData := dataURL("application/pdf", bytes.Repeat([]byte{7}, 30))
	msgs := []agent.ModelMessage{
		user("older", agent.ModelFile{MediaType: "image/png", URL: host.URL + "/cat-label.png"},
			agent.ModelFile{MediaType: "image/png", URL: host.URL + "/page.png", Filename: "page.png"}),
		{Role: "assistant", Text: "ok"},
		user("newest", agent.ModelFile{MediaType: "image/png", URL: host.URL + "/cat.png"},
			agent.ModelFile{MediaType: "application/pdf", URL: pdfData},
			agent.ModelFile{MediaType: "application/pdf", URL: host.URL + "/report.pdf"}),
	}
	files, downloaded, err := r.Resolve(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int][]Sent{
		0: {{URL: dataURL("image/png", pngFile)}, {Stub: "[attachment page.png (image/png) no longer available]"}},
		2: {{URL: host.URL + "/cat.png"}, {URL: pdfData}, {URL: dataURL("application/pdf", pdfFile)}},
	}
	for i, sent := range want {
		for j, s := range sent {
			if files[i][j] != s {
				t.Errorf("message %d file %d: %+v, want %+v", i, j, files[i][j], s)
			}
		}
	}
	if len(downloaded) != 1 || downloaded[host.URL+"/report.pdf"] != int64(len(pdfFile)) {
		t.Errorf("downloaded %v, want the PDF's %d bytes", downloaded, len(pdfFile))
	}
}

// A download of the newest message's file that fails fails the request with a message that names no host.
func TestDownloadFails(t *testing.T) {
	t.Parallel()
	host := fileServer(t, bytes.Repeat([]byte("x"), 100), nil)
	// Only the slow case has a short timeout: under load a TLS handshake alone can take 100 ms.
	tests := []struct {
		name, url, public string
		timeout           time.Duration
	}{
		{"not https", strings.Replace(host.URL, "https://", "http://", 1) + "/report.pdf", "a file is neither a data URL nor an https URL", 0},
		{"not found", host.URL + "/missing.pdf", "a file could not be downloaded (HTTP 404)", 0},
		{"not a PDF", host.URL + "/page.html", "a file's download is text/html, not application/pdf", 0},
		{"over the cap", host.URL + "/report.pdf", "a file is larger than 99 bytes", 0},
		{"too slow", host.URL + "/slow.pdf", "a file could not be downloaded", 100 * time.Millisecond},
		// What a server that gave up sends (seen under -race: the slow handler, its request cancelled, answered 200
		// with no body just as the client's deadline passed).
		{"empty", host.URL + "/empty.pdf", "a file could not be downloaded (no bytes)", 0},
		// Issue 16 item 4: bytes the provider cannot decode were sent, and refused on every later turn.
		{"not a PDF's bytes", host.URL + "/octet.pdf", "a file's download is not an application/pdf file", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := New(Config{Client: host.Client(), MaxFileBytes: 99, Timeout: tt.timeout})
			_, _, err := r.Resolve(context.Background(), []agent.ModelMessage{user("", agent.ModelFile{MediaType: "application/pdf", URL: tt.url})})
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.public)
			if code, msg := agent.Public(err); code != agent.CodeModelError || msg != tt.public || strings.Contains(msg, "127.0.0.1") {
				t.Fatalf("public (%q, %q), want %q", code, msg, tt.public)
			}
		})
	}
}

// The default client connects to public addresses only: a URL that points into the server's own network (here
// the loopback TLS server) is refused before a byte is sent to it.
func TestPublicOnly(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	host := fileServer(t, pdfFile, &asked)
	_, _, err := New(Config{}).Resolve(context.Background(), []agent.ModelMessage{user("", agent.ModelFile{MediaType: "application/pdf", URL: host.URL + "/report.pdf"})})
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "not a public address")
	if asked.Load() != 0 {
		t.Fatalf("the file server was asked %d times", asked.Load())
	}
}

// REVIEW S15: the download dialler refused loopback, private and link-local addresses but dialled shared
// (carrier-grade NAT), benchmark, NAT64 and 6to4 ones, which reach inside many networks.
func TestDeniedRanges(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"100.64.1.1:443", "198.18.0.1:443", "[64:ff9b::a00:1]:443", "[2002:a00:1::1]:443", "192.0.0.8:443", "240.1.2.3:443", "0.1.2.3:443"} {
		if publicOnly("tcp", addr, nil) == nil {
			t.Errorf("%s was allowed", addr)
		}
	}
	for _, addr := range []string{"93.184.215.14:443", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443"} {
		if err := publicOnly("tcp", addr, nil); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}

// A download follows redirects to https only.
func TestRedirectHTTPSOnly(t *testing.T) {
	t.Parallel()
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/pdf")
		w.Write(pdfFile)
	}))
	t.Cleanup(plain.Close)
	host := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/a.pdf", http.StatusFound)
	}))
	t.Cleanup(host.Close)
	_, _, err := New(Config{Client: host.Client()}).Resolve(context.Background(),
		[]agent.ModelMessage{user("", agent.ModelFile{MediaType: "application/pdf", URL: host.URL + "/a.pdf"})})
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "a file could not be downloaded")
}

// A run's steps send the same history again: a file downloaded for one request is not downloaded for the next.
func TestDownloadedOnce(t *testing.T) {
	t.Parallel()
	var gets atomic.Int32
	host := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		w.Header().Set("Content-Type", "application/pdf")
		w.Write([]byte("%PDF-1.7 " + r.URL.Path))
	}))
	t.Cleanup(host.Close)
	r := New(Config{Client: host.Client()})
	for _, path := range []string{"/a.pdf", "/a.pdf", "/b.pdf", "/a.pdf"} {
		msgs := []agent.ModelMessage{user("", agent.ModelFile{MediaType: "application/pdf", URL: host.URL + path})}
		files, downloaded, err := r.Resolve(context.Background(), msgs)
		if err != nil {
			t.Fatal(err)
		}
		if want := dataURL("application/pdf", []byte("%PDF-1.7 "+path)); files[0][0].URL != want || downloaded[host.URL+path] != int64(len("%PDF-1.7 "+path)) {
			t.Fatalf("%s: %+v, %v", path, files[0][0], downloaded)
		}
	}
	if gets.Load() != 2 {
		t.Fatalf("%d downloads for two files", gets.Load())
	}
}

// The cache holds twice MaxFileBytes at most, and nothing older than CacheTTL.
func TestCacheBounds(t *testing.T) {
	t.Parallel()
	c := cache{max: 10}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.put("a", "t", "123456", now)
	c.put("b", "t", "123456", now)
	if _, ok := c.get("a", "t", now); ok {
		t.Fatal("a is kept past the cache's bytes")
	}
	if d, ok := c.get("b", "t", now); !ok || d != "123456" {
		t.Fatalf("b: %q %v", d, ok)
	}
	if _, ok := c.get("b", "other/type", now); ok {
		t.Fatal("b is found under another media type")
	}
	if _, ok := c.get("b", "t", now.Add(CacheTTL)); ok {
		t.Fatal("b is kept past CacheTTL")
	}
}

// One request carries at most MaxRequestBytes of files: the older messages' files beyond it (newest kept first)
// become a line; the newest message's own files over it fail the request.
func TestRequestBytesBounded(t *testing.T) {
	t.Parallel()
	r := New(Config{MaxRequestBytes: 2500})
	pdf := func(name string) agent.ModelFile {
		return agent.ModelFile{MediaType: "application/pdf", URL: dataURL("application/pdf", bytes.Repeat([]byte{7}, 1000)), Filename: name}
	}
	msgs := []agent.ModelMessage{user("one", pdf("old.pdf")), {Role: "assistant", Text: "ok"}, user("two", pdf("mid.pdf")),
		{Role: "assistant", Text: "ok"}, user("three", pdf("new.pdf"))}
	files, _, err := r.Resolve(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if got := files[0][0].Stub; got != "[attachment old.pdf (application/pdf) not shown: the request's files are over 2500 bytes]" {
		t.Errorf("the oldest file: %+v", files[0][0])
	}
	if files[2][0].URL == "" || files[4][0].URL == "" {
		t.Errorf("the newer files: %+v, %+v", files[2][0], files[4][0])
	}
	msgs[4].Files = append(msgs[4].Files, pdf("new2.pdf"), pdf("new3.pdf"))
	_, _, err = r.Resolve(context.Background(), msgs)
	requireError(t, err, agent.KindTooLarge, agent.CodeMessageTooLarge, "the message's files are over 2500 bytes in all")
}

// A URL as logs show it keeps no user info, query or fragment (a pre-signed URL's query is a credential).
func TestSafeURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://u:p@host.example/a/b.pdf?X-Amz-Signature=secret#f": "https://host.example/a/b.pdf",
		"https://host.example": "https://host.example",
		"%zz":                  "(unparsable URL)",
	} {
		if got := SafeURL(in); got != want {
			t.Errorf("SafeURL(%q) = %q, want %q", in, got, want)
		}
	}
}
