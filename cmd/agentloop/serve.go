package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
)

// defaultServeAddr is where `agentloop serve` listens: every interface, as a container's port mapping needs.
const defaultServeAddr = ":8787"

// serveCloseWait bounds the listener's close after a drain: the requests still open then (stream readers of
// other replicas' runs, reads) get this long to end before their connections are cut (a reader resumes on
// another replica).
const serveCloseWait = 2 * time.Second

// serve runs `agentloop serve` until ctx ends (SIGTERM, SIGINT), then drains and returns nil. ready, when set,
// receives the base URL once serving.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("agentloop serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", defaultServeAddr, "listen address HOST:PORT")
	createTable := fs.Bool("create-table", false, "create TABLE_NAME with its indexes if missing (only with AGENTLOOP_DYNAMO_ENDPOINT)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.FromEnv()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: logLevel(cfg.LogLevel)}))
	stack, err := devserver.NewServe(ctx, devserver.ServeOptions{Config: cfg, CreateTable: *createTable, Logger: log})
	if err != nil {
		return err
	}
	defer stack.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	where := "DynamoDB"
	if cfg.DynamoEndpoint != "" {
		where = cfg.DynamoEndpoint
	}
	created := ""
	if stack.TableCreated {
		created = " (created)"
	}
	fmt.Fprintf(stdout, "agentloop serve serving on %s\n  store: table %s on %s%s\n  model: %s (%s)\n  jobs: %s\n  tokens: agentloop token --user NAME, with TABLE_NAME and the same AGENT_SECRET\n",
		url, cfg.TableName, where, created, stack.ModelName, modelSource(stack.Offline), stack.JobsMode)

	// The reaper ticker runs in every replica until the process ends (drain included: the other replicas' dead
	// runs are still reaped meanwhile).
	reaperCtx, stopReaper := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReaper()
	go stack.Run(reaperCtx)

	srv, errc, err := serveUntil(ctx, stack.Handler, ln, url, ready)
	if err != nil {
		return err
	}
	// Draining: every response from now on closes its connection, so a client's next request opens a new one,
	// which the balancer sends to another replica.
	srv.SetKeepAlivesEnabled(false)
	st := stack.Drain(context.Background())
	fmt.Fprintf(stdout, "agentloop serve drained: %d runs finished, %d stopped, %d left to the reaper, %d handed over\n",
		st.Finished, st.Stopped, st.Left, st.HandedOver)
	closeCtx, cancel := context.WithTimeout(context.Background(), serveCloseWait)
	defer cancel()
	if err := srv.Shutdown(closeCtx); err != nil {
		// Requests still open (readers of other replicas' runs): cut; their clients resume elsewhere.
		_ = srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
