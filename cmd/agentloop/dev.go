package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"time"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
)

const (
	defaultAddr = "127.0.0.1:8787"
	defaultData = ".agentloop"
	devUser     = devserver.DevUser
)

// The dev server's connection bounds (REVIEW S22). A request's headers and body must arrive within
// devReadTimeout (a body is at most AGENT_MAX_BODY_BYTES, a client that trickles one would otherwise hold a
// POST /chat forever); a keep-alive connection idle for devIdleTimeout is closed. There is no write timeout: a
// reply streams for as long as its run (bounded by the run wall clock), and the stream's own write deadline
// (lib/uistream) catches a client that stopped reading.
const (
	devReadHeaderTimeout = 10 * time.Second
	devReadTimeout       = time.Minute
	devIdleTimeout       = 2 * time.Minute
)

// devHTTPServer is the dev server's http.Server for h.
func devHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: devReadHeaderTimeout, ReadTimeout: devReadTimeout, IdleTimeout: devIdleTimeout}
}

// serveUntil serves h on ln (devHTTPServer), sends url on ready (when set), and returns when ctx ends, with the
// server still serving for the caller's shutdown, and the channel its Serve's error arrives on; or the error
// Serve failed with first.
func serveUntil(ctx context.Context, h http.Handler, ln net.Listener, url string, ready chan<- string) (*http.Server, <-chan error, error) {
	srv := devHTTPServer(h)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready <- url
	}
	select {
	case err := <-errc:
		return nil, nil, err
	case <-ctx.Done():
		return srv, errc, nil
	}
}

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
	config.SetMemoryLimit(os.Getenv, devserver.MemorySize, log)
	stack, err := devserver.New(ctx, devserver.Options{Data: *data, Config: cfg, Logger: log, Exclusive: true})
	if err != nil {
		return err
	}
	defer stack.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// The profiler listens before the URL is printed: a client that waits for the line finds it there. Its own
	// line names the address it got, so AGENT_PPROF_ADDR may ask for any free port (127.0.0.1:0).
	if cfg.PprofAddr != "" {
		pprofURL, stopProfiler, err := serveProfiler(cfg.PprofAddr, log)
		if err != nil {
			return err
		}
		defer stopProfiler()
		fmt.Fprintf(stdout, "agentloop dev profiler on %s\n", pprofURL)
	}
	url := "http://" + ln.Addr().String()
	tok, err := stack.Token(devUser, config.DefaultTokenTTL)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "agentloop dev serving on %s\n  store: %s\n  model: %s (%s)\n  dev token (user %q, valid %s):\n    %s\n  try:\n    %s\n",
		url, filepath.Join(*data, "agentloop.db"), stack.ModelName, modelSource(stack.Offline), devUser, config.DefaultTokenTTL, tok, curlLine(url, tok))

	go stack.Run(ctx)

	srv, _, err := serveUntil(ctx, stack.Handler, ln, url, ready)
	if err != nil {
		return err
	}
	// Let running turns finish and persist (they are bounded by the run wall clock).
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cmp.Or(cfg.RunTimeout, engine.DefaultRunTimeout))
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// serveProfiler serves net/http/pprof on addr (AGENT_PPROF_ADDR), on a mux of its own: opt-in, for profiling
// the dev server under load (the peer benchmark); the API's port never serves it. It returns the profiler's URL;
// stop closes it.
func serveProfiler(addr string, log *slog.Logger) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("AGENT_PPROF_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: devReadHeaderTimeout}
	url = "http://" + ln.Addr().String() + "/debug/pprof/"
	log.Info("pprof serving", "addr", url)
	go func() { _ = srv.Serve(ln) }()
	return url, func() { _ = srv.Close() }, nil
}

func modelSource(offline bool) string {
	if offline {
		return "offline endpoint, OPENAI_API_KEY unset"
	}
	return "OpenAI-compatible API"
}

func curlLine(url, tok string) string {
	return fmt.Sprintf(`curl -N %s/chat -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' `+
		`-d '{"id":"demo","trigger":"submit-message","messages":[{"id":"m'"$(date +%%s%%N)"'","role":"user","parts":[{"type":"text","text":"hello agentloop"}]}]}'`,
		url, tok)
}

func logLevel(s string) slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return l
}
