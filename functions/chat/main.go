// Command chat is the chat Lambda: POST /chat and GET /chat/{threadId}/stream behind a RESPONSE_STREAM function
// URL. It reads its configuration from the environment, its secrets from SSM at cold start (kept for the
// container's life), and serves the same handler as `agentloop dev` through lambdaurl.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/lib/tools"
)

func main() {
	log := slog.New(lambdacontext.NewLogHandler())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	var h http.Handler
	if err == nil {
		h, err = newHandler(ctx, os.Getenv, awsCfg, log)
	}
	cancel()
	if err != nil {
		log.Error("cold start failed", "err", err)
		os.Exit(1)
	}
	lambdaurl.Start(h)
}

// newHandler builds the chat handler from the environment (getenv) and the AWS configuration.
func newHandler(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error) {
	cfg, err := config.Load(getenv)
	if err != nil {
		return nil, err
	}
	if cfg.TableName == "" {
		return nil, fmt.Errorf("TABLE_NAME is not set")
	}
	secrets, err := ssmsecrets.Load(ctx, ssm.NewFromConfig(awsCfg),
		ssmsecrets.Secret{Label: "application secret", Param: cfg.SecretParam, Fallback: cfg.Secret},
		ssmsecrets.Secret{Label: "OpenAI API key", Param: cfg.OpenAIAPIKeyParam, Fallback: cfg.OpenAIAPIKey, Optional: true})
	if err != nil {
		return nil, err
	}
	clock := agent.SystemClock{}
	verifier, err := auth.NewVerifier(auth.Config{Keys: auth.HMACKey{Secret: []byte(secrets[0])}, Clock: clock,
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience})
	if err != nil {
		return nil, err
	}
	store := dynamo.New(dynamodb.NewFromConfig(awsCfg), cfg.TableName, dynamo.WithLogger(log))
	model := openai.New(openai.Config{BaseURL: cfg.OpenAIBaseURL, APIKey: secrets[1], Model: cfg.Model,
		MaxOutputTokens: cfg.MaxOutputTokens, RequestTimeout: cfg.ModelTimeout, MaxRetries: cfg.AdapterRetries(), Logger: log})
	eng := engine.New(engine.Deps{Store: store, Model: model, Tools: tools.Demo(store, clock), Clock: clock, Logger: log},
		cfg.Engine(cfg.Model))
	log.Info("cold start", "table", cfg.TableName, "model", cfg.Model, "secrets_from_ssm", cfg.SecretParam != "")
	return httpapi.NewChat(httpapi.Deps{Engine: eng, Store: store, Clock: clock, Logger: log,
		Auth: verifier, MaxBodyBytes: cfg.MaxBodyBytes}), nil
}
