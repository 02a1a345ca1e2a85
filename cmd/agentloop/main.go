// Command agentloop is the local binary: `agentloop dev` serves every route on one port with an embedded SQLite
// store and (without OPENAI_API_KEY) the offline model; `agentloop serve` serves the same routes over a DynamoDB
// table, for containers and VMs, several replicas on one table; `agentloop token` prints a token that the dev
// server accepts (or, with TABLE_NAME and AGENT_SECRET set, one that serve accepts).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage:
  agentloop dev   [--addr HOST:PORT] [--data DIR]   serve the whole backend locally (default 127.0.0.1:8787, .agentloop)
  agentloop serve [--addr HOST:PORT] [--create-table]   serve it over the DynamoDB table TABLE_NAME (default :8787);
                  needs AGENT_SECRET; AGENTLOOP_DYNAMO_ENDPOINT for dynalite (--create-table creates the table there);
                  GET /healthz, GET /readyz; SIGTERM drains (AGENT_DRAIN_GRACE)
  agentloop token --user NAME [--data DIR] [--ttl DURATION]   print a bearer token for the dev server, or, with
                  TABLE_NAME and AGENT_SECRET set, for agentloop serve
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("missing command")
	}
	switch args[0] {
	case "dev":
		return dev(ctx, args[1:], stdout, stderr, nil)
	case "serve":
		return serve(ctx, args[1:], stdout, stderr, nil)
	case "token":
		return token(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}
