package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/threads"
)

// maxSmallBody bounds the JSON bodies of the thread routes.
const maxSmallBody = 64 << 10

func (s *server) listThreads(w http.ResponseWriter, r *http.Request) {
	q := threads.ListQuery{Cursor: r.URL.Query().Get("cursor")}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			s.fail(w, r, agent.E(agent.KindInvalid, agent.CodeInvalidLimit, "limit must be a positive integer"))
			return
		}
		q.Limit = n
	}
	ths, page, err := s.Threads.ListPage(r.Context(), subjectOf(r.Context()), q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"threads": ths, "page": page})
}

// pageQuery reads the paging parameters of GET /threads/{id} and /runs: limit, cursor, newest (the bounds are
// lib/threads').
func pageQuery(r *http.Request) (threads.PageQuery, error) {
	var q threads.PageQuery
	vals := r.URL.Query()
	if v := vals.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return q, agent.E(agent.KindInvalid, agent.CodeInvalidLimit, "limit must be an integer from 1 to %d", threads.MaxPageLimit)
		}
		q.Limit = n
	}
	if v := vals.Get("newest"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return q, agent.E(agent.KindInvalid, agent.CodeInvalidCursor, "newest must be true or false")
		}
		q.Newest = b
	}
	q.Cursor = vals.Get("cursor")
	return q, nil
}

func (s *server) getThread(w http.ResponseWriter, r *http.Request) {
	q, err := pageQuery(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v, err := s.Threads.GetPage(r.Context(), subjectOf(r.Context()), r.PathValue("id"), q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

type patchBody struct {
	Title    *string               `json:"title"`
	Settings *agent.ThreadSettings `json:"settings"`
}

func (s *server) patchThread(w http.ResponseWriter, r *http.Request) {
	var body patchBody
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxSmallBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		s.fail(w, r, agent.E(agent.KindInvalid, agent.CodeInvalidJSON, "body must be {\"title\"?: string, \"settings\"?: {\"reviewTools\": bool}}: %v", err))
		return
	}
	th, err := s.Threads.Patch(r.Context(), subjectOf(r.Context()), r.PathValue("id"), agent.ThreadPatch{Title: body.Title, Settings: body.Settings})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"thread": th})
}

func (s *server) deleteThread(w http.ResponseWriter, r *http.Request) {
	if err := s.Threads.Delete(r.Context(), subjectOf(r.Context()), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// stopBody is the optional body of POST /threads/{id}/stop: {"runId": "..."} stops only that run.
type stopBody struct {
	RunID string `json:"runId"`
}

func (s *server) stopRun(w http.ResponseWriter, r *http.Request) {
	var body stopBody
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSmallBody))
	if err == nil && len(data) > 0 {
		err = json.Unmarshal(data, &body)
	}
	if err != nil {
		s.fail(w, r, agent.E(agent.KindInvalid, agent.CodeInvalidJSON, "body must be empty or {\"runId\"?: string}"))
		return
	}
	if q := r.URL.Query().Get("runId"); q != "" && body.RunID == "" {
		body.RunID = q
	}
	runID, err := s.Threads.Stop(r.Context(), subjectOf(r.Context()), r.PathValue("id"), body.RunID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"runId": runID})
}

func (s *server) listRuns(w http.ResponseWriter, r *http.Request) {
	q, err := pageQuery(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	runs, page, err := s.Threads.RunsPage(r.Context(), subjectOf(r.Context()), r.PathValue("id"), q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"runs": runs, "page": page})
}
