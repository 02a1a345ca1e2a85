// Package boot is the cold start every Lambda main shares: JSON logs, the AWS configuration, settings from the
// environment, secrets from SSM (read once, kept for the container's life), the DynamoDB store and the token
// verifier. Each main adds what only it needs and serves its handler with Start.
package boot

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
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

// coldStartTimeout bounds loading the AWS configuration and the secrets.
const coldStartTimeout = 10 * time.Second

// Builder builds a function's handler from the environment and the AWS configuration (tests call it directly).
type Builder func(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error)

// Start runs a function URL Lambda: build the handler once, then serve it through lambdaurl. A failed cold start
// is logged and exits 1, so Lambda reports an init error at once instead of serving half-configured.
func Start(build Builder) {
	log := slog.New(lambdacontext.NewLogHandler())
	ctx, cancel := context.WithTimeout(context.Background(), coldStartTimeout)
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	var h http.Handler
	if err == nil {
		h, err = build(ctx, os.Getenv, awsCfg, log)
	}
	cancel()
	if err != nil {
		log.Error("cold start failed", "err", err)
		os.Exit(1)
	}
	lambdaurl.Start(h)
}

// Base is what every function builds the same way.
type Base struct {
	Config   config.Config
	Clock    agent.Clock
	Store    *dynamo.Store
	Verifier *auth.Verifier
	// Secrets holds the values of the secrets the main asked for, in its order.
	Secrets []string
}

// Secrets names the SSM secrets a function reads. The first must be the application secret (the token key).
// Each main lists its own, so its least-privilege policy can be checked against its source.
type Secrets func(cfg config.Config) []ssmsecrets.Secret

// Load reads the settings and the function's secrets, and builds the store and the verifier.
func Load(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger, wanted Secrets) (Base, error) {
	var b Base
	cfg, err := config.Load(getenv)
	if err != nil {
		return b, err
	}
	if cfg.TableName == "" {
		return b, fmt.Errorf("TABLE_NAME is not set")
	}
	secrets, err := ssmsecrets.Load(ctx, ssm.NewFromConfig(awsCfg), wanted(cfg)...)
	if err != nil {
		return b, err
	}
	if len(secrets) == 0 {
		return b, fmt.Errorf("boot: no application secret requested")
	}
	clock := agent.SystemClock{}
	verifier, err := auth.NewVerifier(auth.Config{Keys: auth.HMACKey{Secret: []byte(secrets[0])}, Clock: clock,
		Issuer: cfg.JWTIssuer, Audience: cfg.JWTAudience})
	if err != nil {
		return b, err
	}
	log.Info("cold start", "table", cfg.TableName, "model", cfg.Model, "secrets_from_ssm", cfg.SecretParam != "")
	return Base{Config: cfg, Clock: clock, Verifier: verifier, Secrets: secrets,
		Store: dynamo.New(dynamodb.NewFromConfig(awsCfg), cfg.TableName, dynamo.WithLogger(log))}, nil
}
