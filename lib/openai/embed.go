package openai

import (
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/openaiwire"
)

// DefaultEmbeddingModel names the embeddings model when Config.EmbeddingModel is empty.
const DefaultEmbeddingModel = openaiwire.DefaultEmbeddingModel

// DefaultEmbedTimeout bounds one embeddings request.
const DefaultEmbedTimeout = openaiwire.DefaultEmbedTimeout

// Model is an agent.Embedder over the provider's POST embeddings (openaiwire.Embedder: batched, no retry).
var _ agent.Embedder = (*Model)(nil)
