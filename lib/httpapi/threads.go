package httpapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// ownedThread loads a thread the caller owns; another user's thread is not found (never forbidden). A stale
// claim is reaped on read (DESIGN.md "Reaper": the routine runs lazily when a thread is read).
func (s *server) ownedThread(r *http.Request, id string) (agent.Thread, error) {
	ctx := r.Context()
	th, err := s.Store.GetThread(ctx, id)
	if err == nil && th.Owner != subjectOf(ctx) {
		err = agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", id)
	}
	if err != nil {
		if agent.IsKind(err, agent.KindNotFound) {
			return th, agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", id)
		}
		return th, err
	}
	if c := th.ActiveRun; c != nil && c.Stale(s.Clock.Now(), s.Engine.Config().StaleAfter) {
		if err := s.Engine.ReapRun(ctx, th.ID, c.RunID, c.Epoch); err != nil {
			s.Logger.Warn("lazy reap", "thread_id", th.ID, "run_id", c.RunID, "err", err)
		} else if fresh, err := s.Store.GetThread(ctx, id); err == nil {
			th = fresh
		}
	}
	return th, nil
}

func (s *server) listThreads(w http.ResponseWriter, r *http.Request) {
	limit := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 200 {
			s.fail(w, r, agent.E(agent.KindInvalid, "invalid_limit", "limit must be an integer from 1 to 200"))
			return
		}
		limit = n
	}
	ths, err := s.Store.ListThreads(r.Context(), subjectOf(r.Context()), limit)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if ths == nil {
		ths = []agent.Thread{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"threads": ths})
}

type threadView struct {
	Thread     agent.Thread      `json:"thread"`
	Messages   []agent.Message   `json:"messages"`
	ActiveRun  *agent.Run        `json:"activeRun"`
	Interrupts []agent.Interrupt `json:"interrupts"`
	Jobs       []agent.Job       `json:"jobs"`
}

func (s *server) getThread(w http.ResponseWriter, r *http.Request) {
	th, err := s.ownedThread(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	recs, err := s.Store.ListMessages(r.Context(), th.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := threadView{Thread: th, Messages: make([]agent.Message, 0, len(recs)), Interrupts: []agent.Interrupt{}, Jobs: []agent.Job{}}
	for _, rec := range recs {
		v.Messages = append(v.Messages, rec.Message)
	}
	if th.ActiveRun != nil {
		if run, err := s.Store.GetRun(r.Context(), th.ID, th.ActiveRun.RunID); err == nil {
			v.ActiveRun = &run
		}
	}
	writeJSON(w, http.StatusOK, v)
}

type patchBody struct {
	Title    *string               `json:"title"`
	Settings *agent.ThreadSettings `json:"settings"`
}

func (s *server) patchThread(w http.ResponseWriter, r *http.Request) {
	th, err := s.ownedThread(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	var body patchBody
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		s.fail(w, r, agent.E(agent.KindInvalid, CodeInvalidJSON, "body must be {\"title\"?: string, \"settings\"?: {\"reviewTools\": bool}}: %v", err))
		return
	}
	if body.Title != nil {
		t := strings.TrimSpace(*body.Title)
		if len(t) > 200 {
			s.fail(w, r, agent.E(agent.KindInvalid, "invalid_title", "title must be at most 200 bytes"))
			return
		}
		body.Title = &t
	}
	th, err = s.Store.UpdateThread(r.Context(), th.ID, agent.ThreadPatch{Title: body.Title, Settings: body.Settings}, s.Clock.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"thread": th})
}

func (s *server) deleteThread(w http.ResponseWriter, r *http.Request) {
	th, err := s.ownedThread(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if th.ActiveRun != nil {
		s.fail(w, r, agent.E(agent.KindConflict, agent.CodeRunActive, "stop the active run before deleting the thread"))
		return
	}
	if err := s.Store.DeleteThread(r.Context(), th.ID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) stopRun(w http.ResponseWriter, r *http.Request) {
	th, err := s.ownedThread(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c, err := s.Store.RequestCancel(r.Context(), th.ID, s.Clock.Now())
	if err != nil {
		if agent.CodeOf(err) == agent.CodeNoActiveRun {
			err = agent.Wrap(err, agent.KindConflict, agent.CodeNoActiveRun, "the thread has no active run")
		}
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"runId": c.RunID})
}

func (s *server) listRuns(w http.ResponseWriter, r *http.Request) {
	th, err := s.ownedThread(r, r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	runs, err := s.Store.ListRuns(r.Context(), th.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if runs == nil {
		runs = []agent.Run{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"runs": runs})
}
