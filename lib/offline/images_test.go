package offline

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// pngBytes starts as a PNG does.
var pngBytes = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")

// imageServer serves /cat.png (a PNG), /page.html (an HTML page served as image/png) and 404 for the rest, over
// TLS as an image host would.
func imageServer(t *testing.T) *httptest.Server {
	t.Helper()
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/cat.png":
			w.Header().Set("Content-Type", "image/png")
			w.Write(pngBytes)
		case "/page.html":
			w.Header().Set("Content-Type", "image/png")
			w.Write([]byte("<!DOCTYPE html><html><body>login</body></html>"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ts.Close)
	return ts
}

// An image named by URL is downloaded, as OpenAI downloads it, and a request whose image cannot be downloaded (an
// expired pre-signed URL answers 404) or is no image is refused with OpenAI's 400: code invalid_image_url,
// "Error while downloading URL." (the URL as sent), or invalid_image_format; param null. Any user message's
// image counts, not only the newest's.
func TestImageURLDownloaded(t *testing.T) {
	t.Parallel()
	img := imageServer(t)
	_, _, url := setup(t, WithFileClient(img.Client()))
	image := func(u string) object {
		return object{"role": "user", "content": []object{{"type": "text", "text": "look"}, {"type": "image_url", "image_url": object{"url": u}}}}
	}
	gone := img.URL + "/gone.png?X-Amz-Expires=60"
	tests := []struct {
		name          string
		msgs          []object
		message, code string // "" for a request answered 200
	}{
		{"an image that downloads", []object{image(img.URL + "/cat.png")}, "", ""},
		{"an image that is gone", []object{image(gone)}, "Error while downloading " + gone + ".", "invalid_image_url"},
		{"an older message's image that is gone", []object{image(gone), assistant("a cat"), user("and now?")},
			"Error while downloading " + gone + ".", "invalid_image_url"},
		{"a page, not an image", []object{image(img.URL + "/page.html")}, msgImageFormat, "invalid_image_format"},
		{"a host that does not answer", []object{image("https://127.0.0.1:1/a.png")},
			"Error while downloading https://127.0.0.1:1/a.png.", "invalid_image_url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := post(t, context.Background(), url, request(false, tt.msgs...))
			defer res.Body.Close()
			if tt.message == "" {
				if res.StatusCode != http.StatusOK {
					t.Fatalf("status %d", res.StatusCode)
				}
				return
			}
			var raw map[string]map[string]any
			if err := json.NewDecoder(res.Body).Decode(&raw); err != nil || len(raw["error"]) != 4 {
				t.Fatalf("body %v (%v) is not {\"error\": {message, type, param, code}}", raw, err)
			}
			e := raw["error"]
			if res.StatusCode != http.StatusBadRequest || e["message"] != tt.message || e["type"] != "invalid_request_error" ||
				e["param"] != nil || e["code"] != tt.code {
				t.Fatalf("status %d, error %v; want 400 %q %s", res.StatusCode, e, tt.message, tt.code)
			}
		})
	}
}
