package openairesponses

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

	"github.com/agentloop/agentloop/lib/agent"
)

// Embeddings: the same account serves POST embeddings beside responses, so an entry of this adapter gives the
// tool router its vectors as package openai's does (this file is that package's embed.go: adapters do not
// import each other).

// DefaultEmbeddingModel names the embeddings model when Config.EmbeddingModel is empty.
const DefaultEmbeddingModel = "text-embedding-3-small"

// DefaultEmbedTimeout bounds one embeddings request.
const DefaultEmbedTimeout = 10 * time.Second

// maxEmbedBody bounds an embeddings answer (2,048 vectors of 1,536 numbers as JSON are about 40 MB).
const maxEmbedBody = 64 << 20

var _ agent.Embedder = (*Model)(nil)

// EmbeddingModel implements agent.Embedder.
func (m *Model) EmbeddingModel() string {
	if m.cfg.EmbeddingModel == "" {
		return DefaultEmbeddingModel
	}
	return m.cfg.EmbeddingModel
}

// embedBatch is the most texts one embeddings request carries (OpenAI takes 2,048).
const embedBatch = 512

// Embed implements agent.Embedder over the provider's POST embeddings, embedBatch texts a request (no retry: a
// router that cannot embed does without).
func (m *Model) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	vecs := make([][]float32, 0, len(texts))
	for start := 0; start < len(texts); start += embedBatch {
		got, err := m.embed(ctx, texts[start:min(start+embedBatch, len(texts))])
		if err != nil {
			return nil, err
		}
		vecs = append(vecs, got...)
	}
	return vecs, nil
}

// embed sends one embeddings request.
func (m *Model) embed(ctx context.Context, texts []string) ([][]float32, error) {
	u, err := url.Parse(m.cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	body, err := json.Marshal(map[string]any{"model": m.EmbeddingModel(), "input": texts})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, DefaultEmbedTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.JoinPath("embeddings").String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if m.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+m.cfg.APIKey)
	}
	res, err := m.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode >= 400 {
		return nil, readAPIError(res)
	}
	var out struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(res.Body, maxEmbedBody)).Decode(&out); err != nil {
		return nil, fmt.Errorf("openairesponses: embeddings answer: %w", err)
	}
	vecs := make([][]float32, len(texts))
	for _, d := range out.Data {
		if d.Index < 0 || d.Index >= len(texts) {
			return nil, fmt.Errorf("openairesponses: embeddings answer: index %d of %d inputs", d.Index, len(texts))
		}
		vecs[d.Index] = d.Embedding
	}
	for i, v := range vecs {
		if v == nil {
			return nil, fmt.Errorf("openairesponses: embeddings answer: no vector for input %d", i)
		}
	}
	return vecs, nil
}
