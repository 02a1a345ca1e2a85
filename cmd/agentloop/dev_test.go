package main

import (
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
