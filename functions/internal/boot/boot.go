// Package boot is the cold start every Lambda main shares: JSON logs, the Go runtime's memory limit from the
// function's memory size, the AWS configuration, settings from the environment, secrets from SSM (read once, kept
// for the container's life), the DynamoDB store, the token verifier when the function reads the application
// secret, and the compositions more than one function needs (the model, the tools, the reaper, the Step
// Functions adapter, and Agent: the engine with everything around it).
// Each main names its secrets, adds what only it needs and serves its handler: Start for a function URL,
// StartTask for a task or schedule target.
package boot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdacontext"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	awseb "github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/emf"
	"github.com/agentloop/agentloop/lib/eventbridge"
	"github.com/agentloop/agentloop/lib/sdkhttp"
	"github.com/agentloop/agentloop/lib/signals"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/lib/webhooks"
)

// coldStartTimeout bounds loading the AWS configuration and the secrets.
const coldStartTimeout = 10 * time.Second

// Builder builds a function URL's handler from the environment and the AWS configuration (tests call it
// directly).
type Builder func(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error)

// TaskBuilder builds a typed task handler (a Step Functions task, a schedule target) the same way. The handler's
// returned error is reported by the Lambda Go runtime with its type name as the errorType, which is what the
// state machine's Retry and Catch match (agent.TransientError, agent.JobFailedError).
type TaskBuilder[In, Out any] func(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (func(context.Context, In) (Out, error), error)

// Start runs a function URL Lambda: build the handler once, then serve it through lambdaurl. A failed cold start
// is logged and exits 1, so Lambda reports an init error at once instead of serving half-configured.
func Start(build Builder) { lambdaurl.Start(coldStart(build)) }

// StartTask runs a task Lambda (no function URL): build the typed handler once, then serve its invocations.
func StartTask[In, Out any](build TaskBuilder[In, Out]) { lambda.StartHandlerFunc(coldStart(build)) }

func coldStart[H any](build func(context.Context, func(string) string, aws.Config, *slog.Logger) (H, error)) H {
	log := slog.New(lambdacontext.NewLogHandler())
	config.SetMemoryLimit(os.Getenv, 0, log)
	ctx, cancel := context.WithTimeout(context.Background(), coldStartTimeout)
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithHTTPClient(sdkhttp.Wrap(awshttp.NewBuildableClient())))
	var h H
	if err == nil {
		h, err = build(ctx, os.Getenv, awsCfg, log)
	}
	cancel()
	if err != nil {
		log.Error("cold start failed", "err", err)
		os.Exit(1)
	}
	return h
}

// Secrets names where the secrets a function reads come from; nil means the function does not read it. Each main
// lists its own (the SSM parameter from cfg with its plain fallback), so its least-privilege policy can be
// checked against its source. Load sets each secret's Label and Optional.
type Secrets struct {
	// App is the application secret: the HS256 token key and the HKDF root (approval signatures).
	App *ssmsecrets.Secret
	// ModelKey is the model provider's API key; optional (an OpenAI-compatible endpoint may need none).
	ModelKey *ssmsecrets.Secret
	// Webhook is the completion webhook's signing secret (AGENT_WEBHOOK_SECRET_PARAM), read only when
	// AGENT_WEBHOOK_URL is set. A main that names it records runs' ends (it runs turns or reaps), so Load builds
	// its completion signals (Base.Signals): the EventBridge event, and the webhook when configured.
	Webhook *ssmsecrets.Secret
}

// Base is what every function builds the same way.
type Base struct {
	Config config.Config
	Clock  agent.Clock
	Store  *dynamo.Store
	AWS    aws.Config
	Log    *slog.Logger
	// AppSecret is the application secret, and Verifier checks tokens with it; both nil unless the function reads it.
	AppSecret []byte
	Verifier  *auth.Verifier
	// ModelKey is the model provider's API key ("" when not read or not set).
	ModelKey string
	// Metrics is where run outcomes and reaped runs go: CloudWatch EMF documents on stdout unless
	// AGENT_METRICS=off.
	Metrics agent.Metrics
	// Refusals counts the function URL's refused requests by code, where Metrics goes.
	Refusals agent.Refusals
	// Signals announces runs' ends (lib/signals: agentloop.run.finished on the default EventBridge bus, and the
	// webhook when AGENT_WEBHOOK_URL is set); nil for a function that names no Webhook secret, or with
	// AGENT_SIGNALS=off.
	Signals agent.RunSignals
	// getenv is the environment Load read (the tools file's ${env:…} references resolve through it).
	getenv func(string) string
}

// dynamoClient is the production DynamoDB client: the SDK's, with HTTP timeouts (dynamo.HTTPClient; REVIEW D3).
func dynamoClient(awsCfg aws.Config, cfg config.Config) *dynamodb.Client {
	return dynamodb.NewFromConfig(awsCfg, func(o *dynamodb.Options) { o.HTTPClient = dynamo.HTTPClient(cfg.StoreTimeout) })
}

// Load reads the settings and the function's secrets (all in one SSM request), and builds the store and, when
// the application secret is read, the token verifier.
func Load(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger, wanted func(cfg config.Config) Secrets) (Base, error) {
	b := Base{AWS: awsCfg, Log: log, Clock: agent.SystemClock{}, getenv: getenv}
	cfg, err := config.Load(getenv)
	if err != nil {
		return b, err
	}
	if cfg.TableName == "" {
		return b, fmt.Errorf("TABLE_NAME is not set")
	}
	if awsCfg.Region == "" {
		return b, fmt.Errorf("no AWS region: set AWS_REGION (Lambda sets it; the stack's SSM parameters and table live there)")
	}
	b.Config = cfg
	want := wanted(cfg)
	var list []ssmsecrets.Secret
	if want.App != nil {
		s := *want.App
		s.Label, s.Optional = "application secret", false
		list = append(list, s)
	}
	if want.ModelKey != nil {
		s := *want.ModelKey
		s.Label, s.Optional = "model API key", true
		list = append(list, s)
	}
	hook := want.Webhook != nil && cfg.WebhookURL != "" && !cfg.SignalsOff
	if hook {
		s := *want.Webhook
		s.Label, s.Optional = "webhook secret (AGENT_WEBHOOK_URL is set)", false
		list = append(list, s)
	}
	fromSSM := false
	for _, s := range list {
		fromSSM = fromSSM || s.Param != ""
	}
	values, err := ssmsecrets.Load(ctx, ssm.NewFromConfig(awsCfg), list...)
	if err != nil {
		return b, firstDeployHint(err, awsCfg.Region)
	}
	if want.App != nil {
		b.AppSecret, values = []byte(values[0]), values[1:]
		acfg := cfg.Auth(b.AppSecret, b.Clock, false)
		if cfg.JWKSURL != "" {
			// The key set is refreshed for the whole life of the execution environment, not only the cold start.
			jwks, err := auth.NewJWKSKeys(context.WithoutCancel(ctx), auth.JWKSConfig{URL: cfg.JWKSURL, Logger: log})
			if err != nil {
				return b, err
			}
			acfg.Keys = auth.Keys{acfg.Keys, jwks}
		}
		if b.Verifier, err = auth.NewVerifier(acfg); err != nil {
			return b, err
		}
	}
	if want.ModelKey != nil {
		b.ModelKey, values = values[0], values[1:]
	}
	log.Info("cold start", "table", cfg.TableName, "model", cfg.Model, "secrets_from_ssm", fromSSM,
		"jobs", cfg.JobsStateMachineARN)
	b.Store = dynamo.New(dynamoClient(awsCfg, cfg), cfg.TableName, dynamo.WithLogger(log))
	if want.Webhook != nil && !cfg.SignalsOff {
		secret := ""
		if hook {
			secret = values[0]
		}
		if b.Signals, err = b.signals(secret); err != nil {
			return b, err
		}
	}
	b.Metrics, b.Refusals = agent.NopMetrics{}, agent.NopMetrics{}
	if cfg.Metrics != config.MetricsOff {
		w := emf.New(os.Stdout, cfg.MetricsNamespace, b.Clock)
		b.Metrics, b.Refusals = w, w
	}
	return b, nil
}

// signals are the functions' completion signals: agentloop.run.finished on the default EventBridge bus, and the
// webhook signed with secret when AGENT_WEBHOOK_URL is set; first attempts on the run's goroutine after its stream
// ended (Lambda freezes a goroutine left running), retries by the reaper's sweep.
func (b Base) signals(secret string) (agent.RunSignals, error) {
	sinks := []agent.SignalSink{eventbridge.New(awseb.NewFromConfig(b.AWS), eventbridge.Options{})}
	if b.Config.WebhookURL != "" {
		hook, err := webhooks.New(webhooks.Config{URL: b.Config.WebhookURL, Secret: secret, Clock: b.Clock})
		if err != nil {
			return nil, fmt.Errorf("AGENT_WEBHOOK_URL: %w", err)
		}
		sinks = append(sinks, hook)
	}
	return signals.New(signals.Deps{Store: b.Store, Sinks: sinks, Clock: b.Clock, Logger: b.Log}, b.Config.Signals(false)), nil
}

// firstDeployHint adds to a cold start's SSM error what a first deploy must create, in which region, and how
// (REVIEW H6): the parameters are per region, and a stack deployed to another region than its parameters
// finds none.
func firstDeployHint(err error, region string) error {
	var missing ssmsecrets.MissingParams
	if !errors.As(err, &missing) {
		return fmt.Errorf("read the SSM parameters in region %s: %w", region, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\nThe stack runs in region %s; create each parameter there (the application secret: 32 bytes or more):", region)
	for _, name := range missing {
		fmt.Fprintf(&b, "\n  aws ssm put-parameter --region %s --type SecureString --name %s --value '<value>'", region, name)
	}
	return fmt.Errorf("%w%s", err, b.String())
}

// ssm is the SSM client of the function's AWS configuration (the tools file and its ${ssm:…} references).
func (b Base) ssm() ssmAPI { return ssm.NewFromConfig(b.AWS) }
