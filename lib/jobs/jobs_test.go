package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
)

// setup returns the openai adapter over the offline endpoint (HTTP, validating requests as the provider does).
func setup(t *testing.T) agent.Model {
	t.Helper()
	srv := httptest.NewServer(offline.New(offline.WithWordDelay(0)))
	t.Cleanup(srv.Close)
	return openai.New(openai.Config{BaseURL: srv.URL + "/v1/", Model: offline.DefaultModel, BackoffBase: time.Millisecond})
}

func TestResearchSubagent(t *testing.T) {
	t.Parallel()
	model := setup(t)
	cases := []struct {
		name     string
		question string
		sources  []string
		brief    string
		err      string // the error's type: transient (model outage) or failed
	}{
		{name: "brief with a cited source", question: "What is Go? See [The Go site](https://go.dev)",
			sources: []string{"https://go.dev"}, brief: "You said: What is Go?"},
		{name: "note_source tool, then the brief", question: `/tool note_source {"title":"RFC 9110","url":"https://www.rfc-editor.org/rfc/rfc9110"}`,
			sources: []string{"https://www.rfc-editor.org/rfc/rfc9110"}, brief: "note_source"},
		// Only an https URL is a source (REVIEW S18: a javascript: URL reached the job's artifact part).
		{name: "note_source refuses other schemes", question: `/tool note_source {"title":"x","url":"javascript:alert(1)"}`,
			brief: "note_source"},
		{name: "model outage", question: "/error 503", err: "unavailable"},
		{name: "step cap", question: `/loop note_source {"title":"x","url":"https://x.test"}`, err: "failed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var activity []string
			env := jobs.Env{Model: model, ModelName: offline.DefaultModel, MaxSteps: 3, Activity: func(s string) { activity = append(activity, s) }}
			input, _ := json.Marshal(jobs.ResearchInput{Question: c.question, Context: "a test"})
			out, err := jobs.Research().Run(context.Background(), env, input)
			var failed *agent.JobFailedError
			switch c.err {
			case "unavailable":
				if !agent.IsKind(err, agent.KindUnavailable) {
					t.Fatalf("err = %v, want a model outage", err)
				}
				return
			case "failed":
				if !errors.As(err, &failed) {
					t.Fatalf("err = %v, want JobFailedError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var r jobs.ResearchResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatal(err)
			}
			var urls []string
			for _, s := range r.Sources {
				urls = append(urls, s.URL)
			}
			if strings.Join(urls, " ") != strings.Join(c.sources, " ") || !strings.Contains(r.Brief, c.brief) {
				t.Fatalf("result %+v", r)
			}
			if len(activity) < 2 || activity[len(activity)-1] != "brief written" {
				t.Fatalf("activity %q", activity)
			}
		})
	}
}

func TestSteer(t *testing.T) {
	t.Parallel()
	reg := jobs.NewRegistry(jobs.Research())
	now := time.Now()
	ok := agent.Job{ID: "job_1", ThreadID: "th", Kind: "research", ToolCallID: "call_1", FinishedAt: now,
		Result: json.RawMessage(`{"brief":"Go is a language.","sources":[{"title":"Go","url":"https://go.dev"}]}`)}
	bad := agent.Job{ID: "job_2", ThreadID: "th", Kind: "research", ToolCallID: "call_2", FinishedAt: now, Error: "it did not finish within 5m0s"}
	for _, c := range []struct {
		job          agent.Job
		text, status string
	}{
		{ok, "Research complete", "done"},
		{bad, "The research job failed: it did not finish within 5m0s", "error"},
	} {
		m := reg.Steer(c.job)
		if m.ID != "steer_"+c.job.ID || m.Role != agent.RoleUser || len(m.Parts) != 2 || !strings.Contains(m.Text(), c.text) {
			t.Fatalf("steer %s: %+v", c.job.ID, m)
		}
		var md struct{ SubagentResult jobs.SteerMeta }
		if err := json.Unmarshal(m.Metadata, &md); err != nil || md.SubagentResult.JobID != c.job.ID || md.SubagentResult.Status != c.status ||
			md.SubagentResult.ToolCallID != c.job.ToolCallID {
			t.Fatalf("metadata %s: %v", m.Metadata, err)
		}
		var part struct {
			Type string
			Data jobs.Artifact
		}
		if err := json.Unmarshal(m.Parts[1], &part); err != nil || part.Type != "data-subagent-artifact" || part.Data.JobID != c.job.ID {
			t.Fatalf("artifact %s: %v", m.Parts[1], err)
		}
		if c.status == "done" && !strings.Contains(m.Text(), "https://go.dev") {
			t.Fatalf("the model does not read the sources: %q", m.Text())
		}
	}
}

func TestJobIDIsAnExecutionName(t *testing.T) {
	t.Parallel()
	for _, th := range []string{"t", strings.Repeat("é", 100), "a/b c"} {
		id := agent.JobID(th, "run_1", "call_1")
		if len(id) > 80 || strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" || id != agent.JobID(th, "run_1", "call_1") || id == agent.JobID(th, "run_1", "call_2") ||
			id == agent.JobID(th, "run_2", "call_1") {
			t.Fatalf("JobID(%q) = %q", th, id)
		}
	}
}
