package matrix

import (
	"testing"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/modelsfile"
)

// Each provider of the matrix becomes a valid one-entry models file that every role names; openai-chat and
// empty change nothing.
func TestUseProvider(t *testing.T) {
	t.Parallel()
	for provider, model := range providerModels {
		var cfg config.Config
		UseProvider(t, &cfg, provider)
		e, ok := cfg.Models.Entry("matrix")
		if !ok || e.Provider != provider || e.Model != model || cfg.Model != "matrix" || cfg.SubagentModel != "matrix" || cfg.TitleModel != "matrix" {
			t.Errorf("%s: entry %+v (%v), config models %q %q %q", provider, e, ok, cfg.Model, cfg.SubagentModel, cfg.TitleModel)
		}
	}
	for _, provider := range []string{"", modelsfile.OpenAIChat} {
		var cfg config.Config
		if UseProvider(t, &cfg, provider); cfg.Models != nil || cfg.Model != "" {
			t.Errorf("%q changed the config: %+v", provider, cfg.Models)
		}
	}
}
