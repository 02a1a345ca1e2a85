// Command api is the thread API Lambda: /threads... and /healthz behind a RESPONSE_STREAM function URL (plain
// JSON replies). It needs the store and the application secret (to verify tokens) but no model: it never runs
// a turn, so it has no access to the OpenAI key.
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
	"github.com/agentloop/agentloop/lib/ssmsecrets"
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

// newHandler builds the API handler from the environment (getenv) and the AWS configuration.
func newHandler(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error) {
	cfg, err := config.Load(getenv)
	if err != nil {
		return nil, err
	}
	if cfg.TableName == "" {
		return nil, fmt.Errorf("TABLE_NAME is not set")
	}
	secrets, err := ssmsecrets.Load(ctx, ssm.NewFromConfig(awsCfg),
		ssmsecrets.Secret{Label: "application secret", Param: cfg.SecretParam, Fallback: cfg.Secret})
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
	// The engine only reaps stale runs here (a thread read finds its run dead); it never calls a model.
	eng := engine.New(engine.Deps{Store: store, Clock: clock, Logger: log},
		engine.Config{RunTimeout: cfg.RunTimeout, StaleAfter: cfg.StaleAfter, Heartbeat: cfg.Heartbeat})
	log.Info("cold start", "table", cfg.TableName, "secrets_from_ssm", cfg.SecretParam != "")
	return httpapi.NewAPI(httpapi.Deps{Engine: eng, Store: store, Clock: clock, Logger: log,
		Auth: verifier, MaxBodyBytes: cfg.MaxBodyBytes}), nil
}
