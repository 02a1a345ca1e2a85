package openai

import (
	"context"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/openaiwire"
)

// DefaultEmbeddingModel names the embeddings model when Config.EmbeddingModel is empty.
const DefaultEmbeddingModel = openaiwire.DefaultEmbeddingModel

// DefaultEmbedTimeout bounds one embeddings request.
const DefaultEmbedTimeout = openaiwire.DefaultEmbedTimeout

var _ agent.Embedder = (*Model)(nil)

// EmbeddingModel implements agent.Embedder.
func (m *Model) EmbeddingModel() string {
	if m.cfg.EmbeddingModel == "" {
		return DefaultEmbeddingModel
	}
	return m.cfg.EmbeddingModel
}

// Embed implements agent.Embedder over the provider's POST embeddings (lib/openaiwire: batched, no retry).
func (m *Model) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	return openaiwire.Client{HTTP: m.cfg.HTTPClient, APIKey: m.cfg.APIKey}.Embed(ctx, m.cfg.BaseURL, m.EmbeddingModel(), texts)
}
