package openaiwire

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/offline"
)

func TestEndpoint(t *testing.T) {
	t.Parallel()
	for base, want := range map[string]string{
		"http://h/v1/": "http://h/v1/responses",
		"http://h/v1":  "http://h/v1/responses",
		"http://h":     "http://h/responses",
	} {
		if got, err := Endpoint(base, "responses"); err != nil || got != want {
			t.Errorf("Endpoint(%q) = %q (%v), want %q", base, got, err, want)
		}
	}
	if _, err := Endpoint("http://h/%zz", "x"); err == nil {
		t.Error("an invalid base URL was taken")
	}
}

// The request body is byte-stable: HTML characters as they are, no final newline.
func TestEncode(t *testing.T) {
	t.Parallel()
	got, err := Encode(map[string]string{"a": "<b> & c"})
	if err != nil || string(got) != `{"a":"<b> & c"}` {
		t.Fatalf("%s (%v)", got, err)
	}
}

func TestReadAPIError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body                 string
		code, param, message string
	}{
		{`{"error":{"message":"bad","code":"invalid_image_url","param":"input"}}`, "invalid_image_url", "input", "bad"},
		{`{"error":{"message":"overloaded","code":529}}`, "529", "", "overloaded"},
		{`{"error":{"message":"no code","code":null}}`, "", "", "no code"},
		{"  <html>gateway</html>\n", "", "", "<html>gateway</html>"},
	}
	for _, tt := range tests {
		res := &http.Response{StatusCode: 400, Body: io.NopCloser(strings.NewReader(tt.body))}
		e := ReadAPIError(res)
		if e.Code != tt.code || e.Param != tt.param || e.Message != tt.message || e.Error() != "the model provider answered HTTP 400 Bad Request" {
			t.Errorf("%s: %+v", tt.body, e)
		}
	}
}

// Stream answers an error status with the provider's error, and a stream with its body.
func TestStream(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" || r.Header.Get("Accept") != "text/event-stream" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"message":"who?"}}`))
			return
		}
		w.Write([]byte("data: x\n\n"))
	}))
	t.Cleanup(hs.Close)
	body, err := Client{HTTP: hs.Client(), APIKey: "k"}.Stream(context.Background(), hs.URL, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(body)
	body.Close()
	if string(b) != "data: x\n\n" {
		t.Fatalf("body %q", b)
	}
	_, err = Client{HTTP: hs.Client()}.Stream(context.Background(), hs.URL, []byte("{}"))
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized || ae.Message != "who?" {
		t.Fatalf("err %v", err)
	}
}

// Embed asks in batches and returns one vector per text, in order.
func TestEmbed(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(offline.New())
	t.Cleanup(hs.Close)
	texts := make([]string, embedBatch+3)
	for i := range texts {
		texts[i] = strings.Repeat("word ", i%7+1)
	}
	vecs, err := Client{HTTP: hs.Client()}.Embed(context.Background(), hs.URL+"/v1/", DefaultEmbeddingModel, texts)
	if err != nil || len(vecs) != len(texts) || len(vecs[0]) != offline.EmbeddingDims {
		t.Fatalf("%d vectors (%v)", len(vecs), err)
	}
	if vecs[0][0] != vecs[7][0] || vecs[embedBatch][0] != vecs[embedBatch%7][0] {
		t.Fatal("the same text got different vectors")
	}
}
