package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
)

// token prints a bearer token for --user that a dev server on the same data directory accepts: aud
// agentloop-dev (auth.DevAudience), which no deployment takes.
func token(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agentloop token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := fs.String("user", "", "subject (user name) the token authenticates")
	data := fs.String("data", defaultData, "data directory of the dev server")
	ttl := fs.Duration("ttl", config.DefaultTokenTTL, "token lifetime")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *user == "" {
		return errors.New("token: --user is required")
	}
	if *ttl <= 0 || *ttl > 365*24*time.Hour {
		return errors.New("token: --ttl must be between 1s and 8760h")
	}
	cfg, err := config.FromEnv()
	if err != nil {
		return err
	}
	// Dev tokens only (REVIEW S13): never in what looks like a deployment's environment, where the secret would be
	// a production one.
	if cfg.TableName != "" || cfg.SecretParam != "" {
		return errors.New("token: TABLE_NAME or AGENT_SECRET_PARAM is set, as in a deployment: agentloop token mints tokens for `agentloop dev` only (unset them)")
	}
	if cfg.JWTMaxAge > 0 && *ttl > cfg.JWTMaxAge {
		return fmt.Errorf("token: --ttl %s is longer than AGENT_JWT_MAX_AGE (%s), after which the dev server refuses the token", *ttl, cfg.JWTMaxAge)
	}
	secret, err := devserver.Secret(*data, cfg.Secret)
	if err != nil {
		return err
	}
	tok, err := auth.MintHS256(secret, *user, *ttl, agent.SystemClock{}.Now(), cfg.DevTokenClaims()...)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
