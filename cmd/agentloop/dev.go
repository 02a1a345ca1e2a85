package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/tools"
)

const (
	defaultAddr = "127.0.0.1:8787"
	defaultData = ".agentloop"
	devUser     = "dev"
	// offlineReplyDelay makes the offline model's replies arrive word by word, as a real model's do.
	offlineReplyDelay = 30 * time.Millisecond
)

// dev serves every route on one port until ctx ends. ready, when set, receives the base URL once serving.
func dev(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("agentloop dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", defaultAddr, "listen address HOST:PORT")
	data := fs.String("data", defaultData, "data directory (SQLite file and dev secret)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.FromEnv()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel(cfg.LogLevel)}))
	secret, err := devSecret(*data, cfg.Secret)
	if err != nil {
		return err
	}
	store, err := sqlite.Open(ctx, filepath.Join(*data, "agentloop.db"))
	if err != nil {
		return err
	}
	defer store.Close()

	baseURL, apiKey, modelName := cfg.OpenAIBaseURL, cfg.OpenAIAPIKey, cfg.Model
	if apiKey == "" {
		var stopModel func()
		baseURL, stopModel, err = offline.Start("127.0.0.1:0", offline.WithReplyDelay(offlineReplyDelay))
		if err != nil {
			return err
		}
		defer stopModel()
		modelName = offline.DefaultModel
	}
	clock := agent.SystemClock{}
	model := openai.New(openai.Config{BaseURL: baseURL, APIKey: apiKey, Model: modelName, MaxOutputTokens: cfg.MaxOutputTokens,
		RequestTimeout: cfg.ModelTimeout, MaxRetries: cfg.AdapterRetries(), Logger: log})
	eng := engine.New(engine.Deps{Store: store, Model: model, Tools: tools.Demo(store, clock), Clock: clock, Logger: log},
		cfg.Engine(modelName))
	verifier, err := auth.NewHS256Verifier(secret, clock)
	if err != nil {
		return err
	}
	handler := httpapi.New(httpapi.Deps{Engine: eng, Store: store, Auth: verifier, Clock: clock, Logger: log,
		MaxBodyBytes: cfg.MaxBodyBytes, AllowOrigins: []string{"*"}})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	tok, err := auth.MintHS256(secret, devUser, config.DefaultTokenTTL, clock.Now())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "agentloop dev serving on %s\n  store: %s\n  model: %s (%s)\n  dev token (user %q, valid %s):\n    %s\n  try:\n    %s\n",
		url, filepath.Join(*data, "agentloop.db"), modelName, modelSource(apiKey), devUser, config.DefaultTokenTTL, tok, curlLine(url, tok))

	go reaper(ctx, eng, cfg.ReaperInterval, cfg.ReaperBatch, log)

	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready <- url
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Let running turns finish and persist (they are bounded by the run wall clock).
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.RunTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// reaper reaps runs whose process died, every interval until ctx ends (in AWS a scheduled function does this).
func reaper(ctx context.Context, eng *engine.Engine, interval time.Duration, batch int, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := eng.ReapStale(ctx, batch); err != nil && ctx.Err() == nil {
				log.Warn("reaper tick", "err", err)
			}
		}
	}
}

func modelSource(apiKey string) string {
	if apiKey == "" {
		return "offline endpoint, OPENAI_API_KEY unset"
	}
	return "OpenAI-compatible API"
}

func curlLine(url, tok string) string {
	return fmt.Sprintf(`curl -N %s/chat -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' `+
		`-d '{"id":"demo","trigger":"submit-message","messages":[{"id":"m'"$(date +%%s%%N)"'","role":"user","parts":[{"type":"text","text":"hello agentloop"}]}]}'`,
		url, tok)
}

// devSecret returns AGENT_SECRET when set, else the data directory's secret file, created on first use.
func devSecret(dir, fromEnv string) ([]byte, error) {
	if fromEnv != "" {
		return []byte(fromEnv), nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "secret")
	if b, err := os.ReadFile(path); err == nil {
		s := strings.TrimSpace(string(b))
		if len(s) < 32 {
			return nil, fmt.Errorf("%s: secret shorter than 32 bytes", path)
		}
		return []byte(s), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	s := hex.EncodeToString(raw)
	// O_EXCL: two processes starting at once agree on the first writer's secret.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return devSecret(dir, "")
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.WriteString(s + "\n"); err != nil {
		return nil, err
	}
	return []byte(s), nil
}

func logLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}
