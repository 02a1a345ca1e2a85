package main

import (
	"log/slog"
	"net/http"
	"testing"
)

// The dev server bounds how long a request may take to arrive and how long an idle connection stays open
// (REVIEW S22: with only ReadHeaderTimeout, a client trickling a POST /chat body held its connection forever).
func TestDevServerBoundsConnections(t *testing.T) {
	t.Parallel()
	srv := devHTTPServer(http.NotFoundHandler())
	if srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 || srv.IdleTimeout <= 0 {
		t.Fatalf("dev server timeouts: header %s, read %s, idle %s; want all set", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.IdleTimeout)
	}
	if srv.WriteTimeout != 0 {
		t.Fatalf("dev server WriteTimeout %s: a streamed reply lasts as long as its run", srv.WriteTimeout)
	}
}

// AGENT_PPROF_ADDR serves net/http/pprof on its own address; the API's port never serves it.
func TestDevProfilerOptIn(t *testing.T) {
	t.Parallel()
	_, stop, err := serveProfiler("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if _, _, err := serveProfiler("not an address", slog.New(slog.DiscardHandler)); err == nil {
		t.Fatal("a bad AGENT_PPROF_ADDR was accepted")
	}

	// Port 0: the banner names the port the profiler got (a port picked by the test and freed again could be
	// taken by another process's connection before the dev server listens on it).
	bin, data := setup(t)
	p := startDev(t, bin, data, "AGENT_PPROF_ADDR=127.0.0.1:0")
	if p.pprof == "" {
		t.Fatal("the banner names no profiler")
	}
	if code, _ := request(t, http.MethodGet, p.pprof+"cmdline", "", ""); code != http.StatusOK {
		t.Fatalf("pprof on AGENT_PPROF_ADDR: %d", code)
	}
	if code, _ := request(t, http.MethodGet, p.url+"/debug/pprof/cmdline", "", ""); code == http.StatusOK {
		t.Fatal("the API's port serves pprof")
	}
	p.stop(t)
}
