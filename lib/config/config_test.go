package config

import (
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/openai"
)

func TestLoad(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		wantErr bool
		check   func(t *testing.T, c Config)
	}{
		{name: "defaults", env: nil, check: func(t *testing.T, c Config) {
			if c.MaxSteps != DefaultMaxSteps || c.RunTimeout != DefaultRunTimeout || c.StaleAfter != DefaultStaleAfter ||
				c.MaxBodyBytes != DefaultMaxBodyBytes || c.Model != DefaultModel || c.ModelRetries != DefaultModelRetries {
				t.Fatalf("defaults not applied: %+v", c)
			}
		}},
		{name: "overrides", env: map[string]string{"AGENT_MAX_STEPS": "3", "AGENT_RUN_TIMEOUT": "5s", "AGENT_MODEL": "m1", "AGENT_MAX_BODY_BYTES": "100"},
			check: func(t *testing.T, c Config) {
				if c.MaxSteps != 3 || c.RunTimeout != 5*time.Second || c.Model != "m1" || c.MaxBodyBytes != 100 {
					t.Fatalf("overrides not applied: %+v", c)
				}
			}},
		{name: "lambda wiring", env: map[string]string{"TABLE_NAME": " t1 ", "AGENT_SECRET_PARAM": "/app/secret", "OPENAI_API_KEY_PARAM": "/app/openai"},
			check: func(t *testing.T, c Config) {
				if c.TableName != "t1" || c.SecretParam != "/app/secret" || c.OpenAIAPIKeyParam != "/app/openai" {
					t.Fatalf("lambda wiring not read: %+v", c)
				}
			}},
		{name: "model defaults are the adapter's", env: nil, check: func(t *testing.T, c Config) {
			if c.ModelFirstTokenTimeout != openai.DefaultFirstTokenTimeout || c.ModelIdleTimeout != openai.DefaultIdleTimeout ||
				c.ModelRetries != openai.DefaultMaxRetries || c.MaxOutputTokens != openai.DefaultMaxOutputTokens ||
				c.ModelMaxTokensField != "" || !c.ModelStreamUsage {
				t.Fatalf("model defaults: %+v", c)
			}
		}},
		{name: "model overrides", env: map[string]string{
			"AGENT_MODEL_TIMEOUT": "7s", "AGENT_MODEL_IDLE_TIMEOUT": "9s", "AGENT_MODEL_RETRIES": "0",
			"OPENAI_MAX_TOKENS_FIELD": "max_tokens", "OPENAI_STREAM_USAGE": "false",
		}, check: func(t *testing.T, c Config) {
			// AGENT_MODEL_TIMEOUT keeps working, as the time to the first token.
			got := c.OpenAI("http://base/v1/", "sk", "m")
			want := openai.Config{
				BaseURL: "http://base/v1/", APIKey: "sk", Model: "m", MaxOutputTokens: DefaultMaxOutputTokens,
				FirstTokenTimeout: 7 * time.Second, IdleTimeout: 9 * time.Second,
				MaxRetries:     -1, // AGENT_MODEL_RETRIES=0 means none; the adapter's zero would mean its default
				MaxTokensParam: openai.MaxTokens, OmitStreamOptions: true,
			}
			if got != want {
				t.Fatalf("openai config %+v, want %+v", got, want)
			}
		}},
		{name: "retries carried to the adapter", env: map[string]string{"AGENT_MODEL_RETRIES": "4"}, check: func(t *testing.T, c Config) {
			if got := c.OpenAI("", "", "m"); got.MaxRetries != 4 || got.FirstTokenTimeout != openai.DefaultFirstTokenTimeout {
				t.Fatalf("openai config %+v", got)
			}
		}},
		{name: "unknown max tokens field", env: map[string]string{"OPENAI_MAX_TOKENS_FIELD": "max_output_tokens"}, wantErr: true},
		{name: "bad stream usage", env: map[string]string{"OPENAI_STREAM_USAGE": "sometimes"}, wantErr: true},
		{name: "bad idle timeout", env: map[string]string{"AGENT_MODEL_IDLE_TIMEOUT": "0s"}, wantErr: true},
		{name: "bad int", env: map[string]string{"AGENT_MAX_STEPS": "many"}, wantErr: true},
		{name: "zero steps", env: map[string]string{"AGENT_MAX_STEPS": "0"}, wantErr: true},
		{name: "bad duration", env: map[string]string{"AGENT_RUN_TIMEOUT": "-1s"}, wantErr: true},
		{name: "heartbeat not below stale", env: map[string]string{"AGENT_HEARTBEAT": "40s"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := Load(func(k string) string { return tt.env[k] })
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.check != nil {
				tt.check(t, c)
			}
		})
	}
}
