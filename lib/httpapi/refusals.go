package httpapi

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Refused requests (REVIEW S9): every response with an error status writes one http.refused line (route, method,
// status, code, owner, duration; the causes only for a 5xx) and counts in the Refusals metric by code, so an
// operator sees users pinned at a limit, token guessing or a broken client. The line never names the URL (a
// pre-signed URL's query is a credential) or a header; the route is the mux pattern.

// recorder is the response writer every route sees: it remembers the owner (authed) and the error (writeError)
// so that the refusal is reported when its status is written, before any byte reaches the client.
type recorder struct {
	http.ResponseWriter
	s        *server
	r        *http.Request
	began    time.Time
	owner    string
	err      error
	reported bool
}

// Unwrap lets http.ResponseController reach the connection (flushes and write deadlines of streams).
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

func (rec *recorder) WriteHeader(status int) {
	if !rec.reported {
		rec.reported = true
		if status >= 400 {
			rec.s.refused(rec, status)
		}
	}
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *recorder) Write(b []byte) (int, error) {
	rec.reported = true // an implicit 200
	return rec.ResponseWriter.Write(b)
}

// observe wraps next so that its refusals are reported.
func (s *server) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&recorder{ResponseWriter: w, s: s, r: r, began: s.Clock.Now()}, r)
	})
}

func (s *server) refused(rec *recorder, status int) {
	code := ""
	if rec.err != nil {
		code, _ = agent.Public(rec.err)
	}
	level := slog.LevelInfo
	attrs := []any{"route", rec.r.Pattern, "method", rec.r.Method, "status", status, "code", code, "owner", rec.owner,
		"duration_ms", s.Clock.Now().Sub(rec.began).Milliseconds()}
	switch {
	case errors.Is(rec.err, agent.ErrOverloaded):
		// Shedding load is the server doing its job: a warning per refusal, not an error (there may be many).
		level = slog.LevelWarn
	case status >= 500:
		level = slog.LevelError
		if rec.err != nil {
			attrs = append(attrs, "err", rec.err.Error())
		}
	}
	s.Logger.Log(rec.r.Context(), level, "http.refused", attrs...)
	if s.Refusals != nil {
		s.Refusals.Refused(code, status)
	}
}

// noteOwner and noteError tell the request's recorder what the refusal line names.
func noteOwner(w http.ResponseWriter, owner string) {
	if rec, ok := w.(*recorder); ok {
		rec.owner = owner
	}
}

func noteError(w http.ResponseWriter, err error) {
	if rec, ok := w.(*recorder); ok {
		rec.err = err
	}
}
