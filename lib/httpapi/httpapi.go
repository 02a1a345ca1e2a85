// Package httpapi is the HTTP contract of DESIGN.md as plain http.Handlers: the chat routes (POST /chat,
// GET /chat/{threadId}/stream) and the API routes (/threads..., /healthz). Lambda serves them through lambdaurl;
// `agentloop dev` mounts both on one port. Errors become HTTP statuses here and nowhere else.
package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/threads"
)

// Authenticator returns the authenticated principal of a request, or an *agent.Error of KindUnauthenticated.
// *auth.Verifier implements it.
type Authenticator interface {
	Verify(ctx context.Context, r *http.Request) (auth.Principal, error)
}

// DefaultMaxBodyBytes bounds a request body: below the 6 MB function URL request limit.
const DefaultMaxBodyBytes = 5 << 20

// Deps are what the handlers need: the services they call, never a store.
type Deps struct {
	Engine  *engine.Engine   // the chat routes
	Threads *threads.Service // the thread routes and resume
	Auth    Authenticator
	Clock   agent.Clock
	Logger  *slog.Logger
	// MaxBodyBytes bounds a request body (413 above it); 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// AllowOrigins enables CORS for these origins ("*" for any). Empty: no CORS headers (function URLs add their own).
	AllowOrigins []string
	// Refusals counts refused requests by code (lib/emf); nil counts none. Each is logged either way (refusals.go).
	Refusals agent.Refusals
	// Pages are further routes served beside the API (mux pattern → handler), such as the web app's page and
	// assets (package web): they get the same CORS, logging and JSON 404 for everything else.
	Pages map[string]http.Handler
	// Admit, when set, is asked before a chat route (POST /chat, GET /chat/{threadId}/stream) authenticates its
	// request: an error refuses the request with its status (a long-lived server that drains on SIGTERM answers
	// 503 draining with a Retry-After: lib/drain). Nil admits every request.
	Admit func(*http.Request) error
	// RequestDeadline, when positive, is the invocation deadline of every POST /chat, counted from its arrival on
	// Clock: the run hands over HandOverMargin before it (engine.WithDeadline; README "Runs longer than one
	// invocation"), its stream ends with the hand-over's metadata, and the run goes on through the engine's
	// launcher. A server with no platform deadline (`agentloop dev`, `agentloop serve` behind a proxy's request
	// timeout: AGENT_REQUEST_DEADLINE) sets it; a Lambda's context carries its own. Zero: none.
	RequestDeadline time.Duration
}

type server struct {
	Deps
}

func newServer(d Deps) *server {
	if d.Clock == nil {
		d.Clock = agent.SystemClock{}
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	d.MaxBodyBytes = cmp.Or(d.MaxBodyBytes, DefaultMaxBodyBytes)
	return &server{Deps: d}
}

// NewChat serves POST /chat and GET /chat/{threadId}/stream (the chat function URL).
func NewChat(d Deps) http.Handler { return newServer(d).handler((*server).chatRoutes) }

// NewAPI serves /threads... and /healthz (the api function URL).
func NewAPI(d Deps) http.Handler { return newServer(d).handler((*server).apiRoutes) }

// New serves every route on one handler (the dev server).
func New(d Deps) http.Handler { return newServer(d).handler((*server).chatRoutes, (*server).apiRoutes) }

func (s *server) handler(routes ...func(*server, *http.ServeMux)) http.Handler {
	mux := http.NewServeMux()
	for _, r := range routes {
		r(s, mux)
	}
	for pattern, h := range s.Pages {
		mux.Handle(pattern, h)
	}
	s.fallback(mux)
	return s.observe(s.cors(mux))
}

func (s *server) chatRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /chat", s.admitted(s.authed(s.postChat)))
	mux.HandleFunc("GET /chat/{threadId}/stream", s.admitted(s.authed(threadPath("threadId", true, s.resumeStream))))
}

// admitted refuses a chat request that Deps.Admit refuses, before anything else reads it.
func (s *server) admitted(h http.HandlerFunc) http.HandlerFunc {
	if s.Admit == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.Admit(r); err != nil {
			writeError(w, err)
			return
		}
		h(w, r)
	}
}

func (s *server) apiRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /threads", s.authed(s.listThreads))
	mux.HandleFunc("GET /threads/{id}", s.authed(threadPath("id", false, s.getThread)))
	mux.HandleFunc("PATCH /threads/{id}", s.authed(threadPath("id", false, s.patchThread)))
	mux.HandleFunc("DELETE /threads/{id}", s.authed(threadPath("id", false, s.deleteThread)))
	mux.HandleFunc("POST /threads/{id}/stop", s.authed(threadPath("id", false, s.stopRun)))
	mux.HandleFunc("GET /threads/{id}/runs", s.authed(threadPath("id", false, s.listRuns)))
}

// threadPath answers a path id that no thread can have (engine.ValidThreadID) as a thread that does not exist,
// before it reaches the store (REVIEW S11: a DynamoDB key over its size limit is a ValidationException, a 500
// and an alarm): 404 thread_not_found, or with noContent 204, as the resume route answers for any thread it
// does not find. The id is not echoed: it may be anything.
func threadPath(param string, noContent bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case engine.ValidThreadID(r.PathValue(param)):
			h(w, r)
		case noContent:
			w.WriteHeader(http.StatusNoContent)
		default:
			writeError(w, agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread not found"))
		}
	}
}

// fallback turns the mux's plain-text 404/405 into the JSON error contract.
func (s *server) fallback(mux *http.ServeMux) {
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, agent.E(agent.KindNotFound, agent.CodeRouteNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
}

type ctxKey struct{}

func subjectOf(ctx context.Context) string {
	p, _ := ctx.Value(ctxKey{}).(auth.Principal)
	return p.Subject
}

// userTokenOf is the caller's bearer token (auth.Principal.Token): only a turn the request runs gets it.
func userTokenOf(ctx context.Context) string {
	p, _ := ctx.Value(ctxKey{}).(auth.Principal)
	return p.Token
}

func (s *server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.Auth.Verify(r.Context(), r)
		if err != nil {
			if agent.KindOf(err) != agent.KindUnauthenticated {
				err = agent.Wrap(err, agent.KindUnauthenticated, agent.CodeUnauthenticated, "authentication failed")
			}
			writeError(w, err)
			return
		}
		noteOwner(w, p.Subject)
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, p)))
	}
}

func (s *server) cors(next http.Handler) http.Handler {
	if len(s.AllowOrigins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := ""
		for _, o := range s.AllowOrigins {
			if o == "*" || o == origin {
				allowed = o
				break
			}
		}
		if allowed != "" && origin != "" {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", allowed)
			h.Add("Vary", "Origin")
			h.Set("Access-Control-Allow-Headers", "authorization, content-type")
			h.Set("Access-Control-Allow-Methods", "GET, POST, PATCH, DELETE, OPTIONS")
			// Retry-After is not a CORS-safelisted header: a browser client sees a 429's (or a 503's) only when it is exposed.
			h.Set("Access-Control-Expose-Headers", "x-vercel-ai-ui-message-stream, retry-after")
			h.Set("Access-Control-Max-Age", "600")
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"ok": true, "time": s.Clock.Now()})
}

// statusOf maps an error kind to its HTTP status (the only place that does).
func statusOf(err error) int {
	switch agent.KindOf(err) {
	case agent.KindNotFound:
		return http.StatusNotFound
	case agent.KindConflict:
		return http.StatusConflict
	case agent.KindInvalid:
		return http.StatusBadRequest
	case agent.KindUnauthenticated:
		return http.StatusUnauthorized
	case agent.KindTooLarge:
		return http.StatusRequestEntityTooLarge
	case agent.KindCanceled:
		return 499
	case agent.KindUnavailable:
		return http.StatusServiceUnavailable
	case agent.KindLimited:
		return http.StatusTooManyRequests
	default:
		return http.StatusInternalServerError
	}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, err error) {
	noteError(w, err)
	var body errorBody
	// Never the chain of causes: provider bodies, AWS request ids and keys go to the log only.
	body.Error.Code, body.Error.Message = agent.Public(err)
	status := statusOf(err)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer`)
	}
	if retry := agent.RetryAfterOf(err); status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable && retry > 0 {
		// A 429 always says when to try again; a 503 when it knows (overloaded: the server refused before
		// writing anything, and catches up within seconds).
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
	}
	writeJSON(w, status, body)
}

// retryAfterSeconds is a Retry-After header value: whole seconds, rounded up, at least 1 (a client told 0 would
// retry at once and be refused again).
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(int64((d+time.Second-1)/time.Second), 1), 10)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
