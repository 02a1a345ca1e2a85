// Package web serves the reference chat app (web/src, a React app on the AI SDK's useChat) from the files Vite
// built into web/dist, embedded at build time: `agentloop dev` serves it at its root, and so does the API
// function in AWS. `make dev` and `make test` build web/dist first when it is missing or stale; a binary built
// without it (a plain `go build` on a fresh clone) serves a page that says how to build it.
package web

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed dist
var dist embed.FS

// Config is what the page reads from ./config.json beside it.
type Config struct {
	// APIURL serves /threads, ChatURL /chat; empty means the page's own origin (the dev server, or the API
	// function for APIURL).
	APIURL  string `json:"apiUrl"`
	ChatURL string `json:"chatUrl"`
	// DevTokenURL, set only by the dev server, is where the page gets a token; a deployment supplies its own
	// sign-in (web/src/token.ts) and never mints tokens over HTTP.
	DevTokenURL string `json:"devTokenUrl,omitempty"`
	// MaxMessageBytes lets the page refuse attachments the server would refuse (0: the page's default).
	MaxMessageBytes int64 `json:"maxMessageBytes,omitempty"`
}

// Built reports whether the embedded files hold a built app.
func Built() bool {
	_, err := fs.Stat(dist, "dist/app/index.html")
	return err == nil
}

// Routes are the patterns the app's handler serves: the page, its assets and its configuration.
var Routes = []string{"GET /{$}", "GET /assets/", "GET /config.json"}

// Handler serves the page at /, the built assets under /assets/ and the configuration at /config.json.
func Handler(cfg Config) http.Handler {
	files, _ := fs.Sub(dist, "dist/app")
	assets := http.FileServerFS(files)
	conf, _ := json.Marshal(cfg)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /config.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(conf)
	})
	mux.HandleFunc("GET /assets/", func(w http.ResponseWriter, r *http.Request) {
		// Vite names assets by content hash: they never change under one name.
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
		assets.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		page, err := fs.ReadFile(files, "index.html")
		if err != nil {
			page = []byte(notBuilt)
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", csp)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write(page)
	})
	return mux
}

// Pages maps each of Routes to h (httpapi.Deps.Pages).
func Pages(h http.Handler) map[string]http.Handler {
	m := make(map[string]http.Handler, len(Routes))
	for _, p := range Routes {
		m[p] = h
	}
	return m
}

// csp keeps the page to its own scripts; connect-src allows the chat and API URLs, which may be other origins.
var csp = strings.Join([]string{
	"default-src 'self'",
	"script-src 'self'",
	"style-src 'self' 'unsafe-inline'",
	"img-src 'self' data: blob: https:",
	"connect-src 'self' https: http://127.0.0.1:* http://localhost:*",
	"frame-ancestors 'none'",
	"base-uri 'self'",
}, "; ")

const notBuilt = `<!doctype html><html lang="en"><meta charset="utf-8"><title>agentloop</title>
<p>The web app is not built into this binary. Run <code>make dev</code> (it builds <code>web/</code> with npm), or
<code>make web</code> before <code>go build</code>.</p></html>
`
