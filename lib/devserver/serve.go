package devserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"sync"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/drain"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/sfn"
)

// `agentloop serve` is this stack as a deployment runs it in a container or on a VM: the same handlers (chat,
// API and web app on one port) over DynamoDB (TABLE_NAME, in the region's DynamoDB or at
// AGENTLOOP_DYNAMO_ENDPOINT), the configured models (the offline one without a key, as in dev), jobs through
// Step Functions when JOBS_STATE_MACHINE_ARN is set (the deployed state machine, its tasks the functions'), else
// the in-process runner with the same contract. Several replicas share one table:
//
//   - Each runs the reaper ticker: every reap decision is a conditional write, so replicas reaping at once do no
//     harm, and a replica that dies has its runs reaped by the others after AGENT_STALE_AFTER.
//   - None reaps at start what the table holds (dev's Options.Exclusive: its lock proves every earlier writer of
//     its SQLite file dead; here the other replicas' runs are alive).
//   - Tokens are a deployment's: HS256 with AGENT_SECRET (and AGENT_JWKS_URL's keys when set), dev tokens
//     refused; `agentloop token` with TABLE_NAME and the same AGENT_SECRET mints one serve takes.
//   - GET /readyz says whether the replica should get traffic (lib/drain), and SIGTERM drains it (Drain).

// ServeOptions configure NewServe.
type ServeOptions struct {
	// Config is the environment's configuration: TABLE_NAME and AGENT_SECRET are required.
	Config config.Config
	// CreateTable creates the table with its indexes (dynamo.Table) when it is missing: only at
	// AGENTLOOP_DYNAMO_ENDPOINT (a deployment's table is the template's; serve never creates one in AWS).
	CreateTable bool
	Logger      *slog.Logger
	// Clock, when set, is every component's clock (and its timers, agent.TimersOf).
	Clock agent.Clock
	// Getenv reads the AWS settings (nil: os.Getenv).
	Getenv func(string) string
}

// Serve is a running `agentloop serve` stack.
type Serve struct {
	*Stack
	Dynamo *dynamo.Store
	// TableCreated reports whether --create-table created the table.
	TableCreated bool
	// JobsMode says where job executions run: "step functions <arn>" or "in-process".
	JobsMode string
	// Gate admits new work until a drain closes it.
	Gate *drain.Gate

	drainCfg drain.Config
	timers   agent.Timers
	log      *slog.Logger
	// leave is the launcher the engine and the reaper continue runs through: the local one until a drain, which
	// leaves continuations to the other replicas.
	leave *leavingLauncher
}

// ErrCreateTableNeedsEndpoint refuses --create-table without AGENTLOOP_DYNAMO_ENDPOINT.
var ErrCreateTableNeedsEndpoint = errors.New("--create-table needs AGENTLOOP_DYNAMO_ENDPOINT (dynalite or another DynamoDB-compatible endpoint): " +
	"a table in AWS is the deployment's (template.yaml's Table resource), never created by agentloop serve")

// NewServe builds the stack over DynamoDB. Close releases it; Run serves the reaper ticker; Drain drains it.
func NewServe(ctx context.Context, o ServeOptions) (*Serve, error) {
	cfg := o.Config
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	switch {
	case o.CreateTable && cfg.DynamoEndpoint == "":
		return nil, ErrCreateTableNeedsEndpoint
	case cfg.TableName == "":
		return nil, errors.New("TABLE_NAME is not set: agentloop serve keeps its threads in that DynamoDB table")
	case cfg.Secret == "" && cfg.SecretParam != "":
		return nil, errors.New("AGENT_SECRET_PARAM is set but AGENT_SECRET is not: agentloop serve reads no SSM parameter; " +
			"give the secret as AGENT_SECRET (in ECS, the task definition's secrets[].valueFrom names the parameter)")
	case cfg.Secret == "":
		return nil, errors.New("AGENT_SECRET is not set: it is the HS256 token key and the root of the approval signatures (32 bytes or more)")
	}
	awsCfg, err := awsConfig(ctx, cfg, getenv)
	if err != nil {
		return nil, err
	}
	client := dynamodb.NewFromConfig(awsCfg, func(d *dynamodb.Options) {
		d.HTTPClient = dynamo.HTTPClient(cfg.StoreTimeout)
		if cfg.DynamoEndpoint != "" {
			d.BaseEndpoint = aws.String(cfg.DynamoEndpoint)
		}
	})
	s := &Serve{Gate: drain.NewGate(0), drainCfg: cfg.Drain(), log: log, JobsMode: "in-process"}
	if o.CreateTable {
		if s.TableCreated, err = dynamo.Table().EnsureTable(ctx, client, cfg.TableName); err != nil {
			return nil, err
		}
	}
	s.Dynamo = dynamo.New(client, cfg.TableName, dynamo.WithLogger(log))
	clock := o.Clock
	if clock == nil {
		clock = agent.SystemClock{}
	}
	s.timers = agent.TimersOf(clock)
	s.leave = &leavingLauncher{log: log}
	opts := Options{Config: cfg, Store: s.Dynamo, Logger: log, Clock: clock, Deployment: true, Admit: s.Gate.Admit,
		Pages:     map[string]http.Handler{"GET /readyz": s.readyz()},
		launchers: func(l agent.RunLauncher) agent.RunLauncher { s.leave.next = l; return s.leave }}
	if cfg.JobsStateMachineARN != "" {
		opts.Jobs = sfn.New(awssfn.NewFromConfig(awsCfg), cfg.JobsStateMachineARN)
		s.JobsMode = "step functions " + cfg.JobsStateMachineARN
	}
	if s.Stack, err = New(ctx, opts); err != nil {
		return nil, err
	}
	return s, nil
}

// awsConfig is the AWS configuration: the default chain (an ECS task's role, the environment, a profile). At a
// local endpoint, with no credentials in the environment, placeholder ones (dynalite checks only that a request
// is signed) and us-east-1 when no region is set; in AWS a region is required.
func awsConfig(ctx context.Context, cfg config.Config, getenv func(string) string) (aws.Config, error) {
	// The DynamoDB client gets its own HTTP client (dynamo.HTTPClient: its timeouts), so none is set here (one set
	// here would also refuse AWS_CA_BUNDLE).
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, err
	}
	if cfg.DynamoEndpoint == "" {
		if awsCfg.Region == "" {
			return aws.Config{}, errors.New("no AWS region: set AWS_REGION (the table, and the state machine, live there), or AGENTLOOP_DYNAMO_ENDPOINT for a local endpoint")
		}
		return awsCfg, nil
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	if getenv("AWS_ACCESS_KEY_ID") == "" && getenv("AWS_PROFILE") == "" {
		awsCfg.Credentials = credentials.NewStaticCredentialsProvider("local", "local", "")
	}
	return awsCfg, nil
}

// readyz is GET /readyz: the store answers a read (GetThread of an id no client sends: not found is an answer),
// and the model's endpoints answer HTTP at all (any status: reachable; its keys are the requests' business).
// The checks read s.Stack when asked, so the route exists before the stack does.
func (s *Serve) readyz() http.Handler {
	hc := &http.Client{}
	store := drain.Check{Name: "store", Code: agent.CodeStoreUnavailable, Probe: func(ctx context.Context) error {
		_, err := s.Store.GetThread(ctx, readyProbeThread)
		if err == nil || agent.KindOf(err) == agent.KindNotFound {
			return nil
		}
		return err
	}}
	model := drain.Check{Name: "model", Code: agent.CodeModelUnavailable, Probe: func(ctx context.Context) error {
		urls := s.modelEndpoints()
		errs := make([]error, len(urls))
		var wg sync.WaitGroup
		for i, u := range urls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = reachable(ctx, hc, u)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}}
	return drain.Ready(s.Gate, 0, s.log, store, model)
}

// readyProbeThread is the thread id readiness reads: '#' is in no valid thread id (engine.ValidThreadID), so no
// client's thread has it.
const readyProbeThread = "agentloop#readyz"

// reachable reports whether u answers an HTTP GET at all.
func reachable(ctx context.Context, hc *http.Client, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	return res.Body.Close()
}

// modelEndpoints are the model endpoints readiness asks after: the one OpenAI-compatible base URL (the offline
// model's in-process, OPENAI_BASE_URL, or OpenAI's), or with a models file each entry's, its provider's own when
// it names none (a Bedrock entry's region's, and the offline one for another entry with neither baseURL nor
// apiKey).
func (s *Serve) modelEndpoints() []string {
	cfg := s.Stack.cfg
	if cfg.Models == nil {
		if s.ModelURL != "" {
			return []string{s.ModelURL}
		}
		return []string{openAIURL}
	}
	seen := map[string]bool{}
	var urls []string
	for _, e := range cfg.Models.Models {
		u := e.BaseURL
		switch {
		case u != "":
		case modelsfile.Bedrock(e.Provider): // Bedrock with the process's AWS configuration (Options.Deployment)
			u = fmt.Sprintf("https://bedrock-runtime.%s.amazonaws.com/", url.PathEscape(e.Region))
		case e.APIKey == "":
			u = s.ModelURL // the offline model's
		case e.Provider == modelsfile.Anthropic:
			u = anthropicURL
		default:
			u = openAIURL
		}
		if !seen[u] {
			seen[u] = true
			urls = append(urls, u)
		}
	}
	return urls
}

// The providers' own endpoints (the SDKs' defaults), for readiness.
const (
	openAIURL    = "https://api.openai.com/v1/"
	anthropicURL = "https://api.anthropic.com/v1/"
)

// Drain drains the stack (lib/drain): the gate closes (new chat requests and stream readers get 503 draining,
// GET /readyz too), the runs it holds get AGENT_DRAIN_GRACE to finish, then what is left hands over at its next
// step boundary (the engine's HandOverAll) with its continuation left to another replica, and what has not
// handed over within drain.DefaultStopWait is stopped as the stop endpoint stops a run. From the drain's start
// this replica starts no continuation (its launcher leaves them: leavingLauncher) and its reaper continues none
// (reaper.Hold): a continuation started here would die with the process. The other replicas' reapers continue
// the handed-over runs once their claims are stale (AGENT_STALE_AFTER). The caller then closes the listener and
// the stack.
func (s *Serve) Drain(ctx context.Context) drain.Stats {
	s.leave.leaving.Store(true)
	s.Reaper.Hold()
	return drain.Run(ctx, s.Gate, &stackRuns{s: s.Stack, asked: map[engine.LocalRun]bool{}}, s.drainCfg, s.timers, s.log)
}

// leavingLauncher launches through next until a drain; from then on it takes every continuation and starts none
// (the run hands over and ends here; its claim goes stale and another replica's reaper continues it). A refusal
// would keep the run going here (engine: a launch that fails leaves the run where it is).
type leavingLauncher struct {
	next    agent.RunLauncher
	leaving atomic.Bool
	log     *slog.Logger
}

func (l *leavingLauncher) Launch(ctx context.Context, c agent.Continuation) error {
	if l.leaving.Load() {
		l.log.Info("drain.handed_over", "thread_id", c.ThreadID, "run_id", c.RunID, "epoch", c.Epoch, "segment", c.Segment,
			"steps", c.Steps)
		return nil
	}
	return l.next.Launch(ctx, c)
}

// stackRuns are the engine's runs as a drain sees them.
type stackRuns struct {
	s     *Stack
	asked map[engine.LocalRun]bool
}

// Running counts the runs the engine admitted and has not seen end (Load: claimed or being claimed) and those
// streaming in it (LocalRuns), which include the continuations its launcher runs (background runs, hand-overs:
// Load does not count those); a run in both is counted once, so none running is exactly zero.
func (r *stackRuns) Running() int {
	return max(r.s.Engine.Load().Running, len(r.s.Engine.LocalRuns()))
}

// HandOver makes every run hand over at its next step boundary (its continuation left: leavingLauncher).
func (r *stackRuns) HandOver() { r.s.Engine.HandOverAll() }

// Stop stops each run as the stop endpoint does (threads.Service.Stop): the stop stored on the claim first (the
// truth every process reads, and what decides the run's outcome), then the run told in memory. A stop the store
// refused still reaches the run in memory: it ends canceled all the same.
func (r *stackRuns) Stop(ctx context.Context) int {
	n := 0
	for _, run := range r.s.Engine.LocalRuns() {
		if r.asked[run] {
			continue
		}
		r.asked[run] = true
		if _, err := r.s.Store.RequestCancel(ctx, run.ThreadID, run.RunID, r.s.clock.Now()); err != nil && !errors.Is(err, agent.ErrNoActiveRun) {
			r.s.log.Warn("drain.stop", "thread_id", run.ThreadID, "run_id", run.RunID, "err", err)
		}
		r.s.Engine.StopLocal(run.ThreadID, run.RunID)
		n++
	}
	return n
}
