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

// token prints a bearer token for --user. Without TABLE_NAME it is a dev token that a dev server on the same data
// directory accepts: aud agentloop-dev (auth.DevAudience), which no deployment takes. With TABLE_NAME set, as
// `agentloop serve` has it, it is a deployment's token, minted with AGENT_SECRET, which must then be set
// explicitly (never read from a data directory, never from SSM): aud AGENT_JWT_AUDIENCE and iss AGENT_JWT_ISSUER
// when set (config.DeploymentTokenClaims), never the dev audience, so serve, which refuses dev tokens, takes it.
// Minting one needs the deployment's secret itself, which grants that much anyway.
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
	// A dev token never in what looks like a deployment's environment (REVIEW S13), where the secret would be a
	// production one; a deployment's token only from a secret given explicitly.
	switch {
	case cfg.SecretParam != "":
		return errors.New("token: AGENT_SECRET_PARAM is set, as in a Lambda deployment: agentloop token reads no SSM parameter " +
			"(unset it; for agentloop serve, set TABLE_NAME and AGENT_SECRET as serve has them)")
	case cfg.TableName != "" && cfg.Secret == "":
		return errors.New("token: TABLE_NAME is set, as agentloop serve has it, but AGENT_SECRET is not: a token for serve is minted with serve's AGENT_SECRET " +
			"(unset TABLE_NAME for a dev token)")
	}
	server := "the dev server"
	if cfg.TableName != "" {
		server = "agentloop serve"
	}
	if cfg.JWTMaxAge > 0 && *ttl > cfg.JWTMaxAge {
		return fmt.Errorf("token: --ttl %s is longer than AGENT_JWT_MAX_AGE (%s), after which %s refuses the token", *ttl, cfg.JWTMaxAge, server)
	}
	claims, secret := cfg.DeploymentTokenClaims(), []byte(cfg.Secret)
	if cfg.TableName == "" {
		claims = cfg.DevTokenClaims()
		if secret, err = devserver.Secret(*data, cfg.Secret); err != nil {
			return err
		}
	}
	tok, err := auth.MintHS256(secret, *user, *ttl, agent.SystemClock{}.Now(), claims...)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
