package web_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/web"
)

func setup(t *testing.T, cfg web.Config) func(path string) (*http.Response, string) {
	t.Helper()
	if !web.Built() {
		t.Fatal("the web app is not built into this binary: run `make web` (make test does) before go test")
	}
	srv := httptest.NewServer(web.Handler(cfg))
	t.Cleanup(srv.Close)
	return func(path string) (*http.Response, string) {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
}

// The page, its assets and its configuration; the page keeps to its own scripts (CSP) and is never cached stale,
// the content-hashed assets are cached for good.
func TestHandler(t *testing.T) {
	t.Parallel()
	get := setup(t, web.Config{ChatURL: "https://chat.example", MaxMessageBytes: 1234})
	resp, page := get("/")
	if resp.StatusCode != 200 || !strings.Contains(page, `<div id="root">`) || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") ||
		resp.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("GET /: %d %v %.100s", resp.StatusCode, resp.Header, page)
	}
	asset := page[strings.Index(page, "./assets/")+1:]
	asset = asset[:strings.IndexByte(asset, '"')]
	if resp, js := get(asset); resp.StatusCode != 200 || len(js) == 0 || !strings.Contains(resp.Header.Get("Cache-Control"), "immutable") {
		t.Fatalf("GET %s: %d %v", asset, resp.StatusCode, resp.Header)
	}
	var cfg web.Config
	if resp, body := get("/config.json"); resp.StatusCode != 200 || json.Unmarshal([]byte(body), &cfg) != nil ||
		cfg != (web.Config{ChatURL: "https://chat.example", MaxMessageBytes: 1234}) {
		t.Fatalf("GET /config.json: %d %s", resp.StatusCode, body)
	}
	if resp, _ := get("/assets/nope.js"); resp.StatusCode != 404 {
		t.Fatalf("a missing asset: %d", resp.StatusCode)
	}
}

func TestPagesCoverTheRoutes(t *testing.T) {
	t.Parallel()
	h := http.NotFoundHandler()
	pages := web.Pages(h)
	if len(pages) != len(web.Routes) {
		t.Fatalf("%d pages for %d routes", len(pages), len(web.Routes))
	}
	for _, r := range web.Routes {
		if pages[r] == nil {
			t.Fatalf("route %s has no handler", r)
		}
	}
}
