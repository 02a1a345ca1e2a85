// Package openaiwire is what OpenAI's HTTP APIs share, spoken alike by the Chat Completions adapter (lib/openai)
// and the Responses adapter (lib/openairesponses), which never import each other: an endpoint under a base URL,
// a JSON request body encoded byte-stable, a POST answered with an event stream, the {"error": {...}} body of an
// error status, and the embeddings endpoint. With the standard library only (see lib/openai on why not openai-go).
package openaiwire

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// DefaultBaseURL is OpenAI's API root.
const DefaultBaseURL = "https://api.openai.com/v1/"

// Client is an API root and its key.
type Client struct {
	HTTP   *http.Client
	APIKey string // sent as a bearer token when set
}

// Endpoint is base's URL for path: base is a path prefix whether or not it ends with a slash.
func Endpoint(base, path string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	return u.JoinPath(path).String(), nil
}

// Encode is v's JSON, HTML characters as they are, without a final newline (the prompt prefix is sent byte for
// byte alike on every step, so a provider's prompt cache holds).
func Encode(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// Stream posts body to endpoint asking for an event stream and returns the stream's body, or the provider's
// error answer (*APIError), or the transport's error.
func (c Client) Stream(ctx context.Context, endpoint string, body []byte) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	res, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 400 {
		defer res.Body.Close()
		return nil, ReadAPIError(res)
	}
	return res.Body, nil
}

// APIError is a provider's answer with an HTTP error status, with what its {"error": {...}} body says.
type APIError struct {
	StatusCode int
	Code       string // e.g. "invalid_image_url"; a number as its digits
	Param      string // the request field the error names, e.g. "reasoning.summary"
	Message    string // the provider's message, or the start of a body that is not OpenAI's error shape
	Response   *http.Response
}

func (e *APIError) Error() string {
	return fmt.Sprintf("the model provider answered HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// maxErrorBody bounds the error body read from a provider.
const maxErrorBody = 64 << 10

// ReadAPIError reads res's error body (64 KiB of it at most).
func ReadAPIError(res *http.Response) *APIError {
	e := &APIError{StatusCode: res.StatusCode, Response: res}
	b, _ := io.ReadAll(io.LimitReader(res.Body, maxErrorBody))
	var body struct {
		Error struct {
			Message string          `json:"message"`
			Code    json.RawMessage `json:"code"`
			Param   string          `json:"param"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &body) != nil || (body.Error.Message == "" && len(body.Error.Code) == 0) {
		e.Message = strings.TrimSpace(string(b[:min(len(b), 300)]))
		return e
	}
	e.Message, e.Param = body.Error.Message, body.Error.Param
	e.Code = CodeString(body.Error.Code)
	return e
}

// CodeString reads an error code that is a string, a number (its digits) or null ("").
func CodeString(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	return string(raw)
}

// DefaultEmbeddingModel names the embeddings model when a request names none.
const DefaultEmbeddingModel = "text-embedding-3-small"

// DefaultEmbedTimeout bounds one embeddings request.
const DefaultEmbedTimeout = 10 * time.Second

// maxEmbedBody bounds an embeddings answer (2,048 vectors of 1,536 numbers as JSON are about 40 MB).
const maxEmbedBody = 64 << 20

// embedBatch is the most texts one embeddings request carries (OpenAI takes 2,048).
const embedBatch = 512

// Embedder is agent.Embedder over an API root's POST embeddings; an adapter's Model embeds it.
type Embedder struct {
	Client  Client
	BaseURL string
	Model   string // the embeddings model (DefaultEmbeddingModel when empty)
}

// EmbeddingModel implements agent.Embedder.
func (e Embedder) EmbeddingModel() string {
	if e.Model == "" {
		return DefaultEmbeddingModel
	}
	return e.Model
}

// Embed implements agent.Embedder (Client.Embed).
func (e Embedder) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	return e.Client.Embed(ctx, e.BaseURL, e.EmbeddingModel(), texts)
}

// Embed asks base's POST embeddings for the vectors of texts with model, embedBatch texts a request (no retry:
// a router that cannot embed does without).
func (c Client) Embed(ctx context.Context, base, model string, texts []string) ([][]float32, error) {
	endpoint, err := Endpoint(base, "embeddings")
	if err != nil {
		return nil, err
	}
	vecs := make([][]float32, 0, len(texts))
	for start := 0; start < len(texts); start += embedBatch {
		got, err := c.embed(ctx, endpoint, model, texts[start:min(start+embedBatch, len(texts))])
		if err != nil {
			return nil, err
		}
		vecs = append(vecs, got...)
	}
	return vecs, nil
}

// embed sends one embeddings request.
func (c Client) embed(ctx context.Context, endpoint, model string, texts []string) ([][]float32, error) {
	body, err := json.Marshal(map[string]any{"model": model, "input": texts})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultEmbedTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	res, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode >= 400 {
		return nil, ReadAPIError(res)
	}
	var out struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, maxEmbedBody)).Decode(&out); err != nil {
		return nil, fmt.Errorf("embeddings answer: %w", err)
	}
	vecs := make([][]float32, len(texts))
	for _, d := range out.Data {
		if d.Index < 0 || d.Index >= len(texts) {
			return nil, fmt.Errorf("embeddings answer: index %d of %d inputs", d.Index, len(texts))
		}
		vecs[d.Index] = d.Embedding
	}
	for i, v := range vecs {
		if v == nil {
			return nil, fmt.Errorf("embeddings answer: no vector for input %d", i)
		}
	}
	return vecs, nil
}
