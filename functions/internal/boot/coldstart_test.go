package boot

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

// REVIEW H6: a first deploy whose SSM parameters do not exist (or exist in another region) fails its cold start
// with a message that names the region and every parameter to create, with the command that creates it.
func TestColdStartSaysWhatToCreate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_, _ = io.WriteString(w, `{"Parameters":[],"InvalidParameters":["/agentloop/agent-secret","/agentloop/openai-api-key"]}`)
	}))
	defer srv.Close()
	env := map[string]string{"TABLE_NAME": "t", "AGENT_SECRET_PARAM": "/agentloop/agent-secret", "OPENAI_API_KEY_PARAM": "/agentloop/openai-api-key"}
	awsCfg := aws.Config{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", "")}
	_, err := Load(context.Background(), func(k string) string { return env[k] }, awsCfg, slog.New(slog.DiscardHandler),
		func(cfg config.Config) Secrets {
			return Secrets{App: &ssmsecrets.Secret{Param: cfg.SecretParam}, ModelKey: &ssmsecrets.Secret{Param: cfg.OpenAIAPIKeyParam}}
		})
	if err == nil {
		t.Fatal("cold start succeeded without its parameters")
	}
	for _, want := range []string{"eu-west-1", "aws ssm put-parameter --region eu-west-1 --type SecureString --name /agentloop/agent-secret",
		"aws ssm put-parameter --region eu-west-1 --type SecureString --name /agentloop/openai-api-key"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("cold start error lacks %q:\n%v", want, err)
		}
	}
	awsCfg.Region = ""
	if _, err := Load(context.Background(), func(k string) string { return env[k] }, awsCfg, slog.New(slog.DiscardHandler),
		func(config.Config) Secrets { return Secrets{} }); err == nil || !strings.Contains(err.Error(), "AWS_REGION") {
		t.Errorf("cold start without a region: %v, want a message naming AWS_REGION", err)
	}
}
