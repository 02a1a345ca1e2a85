package sfn_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"
)

const machineARN = "arn:aws:states:us-east-1:000000000000:stateMachine:jobs"

// request is one StartExecution the fake endpoint got.
type request struct {
	StateMachineArn, Name, Input string
}

// setup is the adapter over a real SDK client (no retries) whose endpoint answers every request with status
// and body, recording what it was sent.
func setup(t *testing.T, status int, body string) (*sfn.Jobs, func() []request) {
	t.Helper()
	var mu sync.Mutex
	var got []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if target := r.Header.Get("X-Amz-Target"); target != "AWSStepFunctions.StartExecution" {
			t.Errorf("target %q, want StartExecution", target)
		}
		var req request
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &req); err != nil {
			t.Errorf("request body %s: %v", b, err)
		}
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return sfn.New(client(srv.URL), machineARN), func() []request {
		mu.Lock()
		defer mu.Unlock()
		return append([]request(nil), got...)
	}
}

func client(endpoint string) *awssfn.Client {
	return awssfn.New(awssfn.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(endpoint),
		Credentials:      credentials.NewStaticCredentialsProvider("k", "s", ""),
		RetryMaxAttempts: 1,
	})
}

const started = `{"executionArn":"arn:aws:states:us-east-1:000000000000:execution:jobs:x","startDate":1.7e9}`

// Start names the execution by the job id and sends {threadId, jobId}; Wake sends the task as given under
// WakeName. One request each.
func TestStartAndWakeRequests(t *testing.T) {
	t.Parallel()
	j := agent.Job{ID: agent.JobID("thr_1", "run_1", "call_1"), ThreadID: "thr_1", Kind: "research", ToolCallID: "call_1", Input: []byte(`{"q":1}`)}
	w := agent.JobTask{ThreadID: "thr_1", JobID: j.ID, Wake: "run_7"}
	cases := []struct {
		name string
		call func(*sfn.Jobs) error
		want request
	}{
		{"Start", func(s *sfn.Jobs) error { return s.Start(context.Background(), j) },
			request{machineARN, j.ID, `{"threadId":"thr_1","jobId":"` + j.ID + `"}`}},
		{"Wake", func(s *sfn.Jobs) error { return s.Wake(context.Background(), w) },
			request{machineARN, sfn.WakeName("thr_1", "run_7"), `{"threadId":"thr_1","jobId":"` + j.ID + `","wake":"run_7"}`}},
		{"Wake of the queue", func(s *sfn.Jobs) error {
			return s.Wake(context.Background(), agent.JobTask{ThreadID: "thr_1", Wake: "k"})
		},
			request{machineARN, sfn.WakeName("thr_1", "k"), `{"threadId":"thr_1","wake":"k"}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, sent := setup(t, 200, started)
			if err := tc.call(s); err != nil {
				t.Fatal(err)
			}
			if got := sent(); len(got) != 1 || got[0] != tc.want {
				t.Fatalf("sent %+v, want exactly %+v", got, tc.want)
			}
		})
	}
}

// Step Functions' answers, mapped: ExecutionAlreadyExists is success, throttling, the execution limit and 5xx
// are unavailable, the rest internal. Bodies as the service sends them (__type with or without its namespace).
func TestErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		status int
		body   string
		want   agent.Kind // -1: no error
	}{
		{"already exists", 400, `{"__type":"ExecutionAlreadyExists","message":"Execution Already Exists: 'arn'"}`, -1},
		{"already exists, namespaced", 400, `{"__type":"com.amazonaws.swf.service.v2.model#ExecutionAlreadyExists","message":"x"}`, -1},
		{"throttled", 400, `{"__type":"ThrottlingException","message":"Rate exceeded"}`, agent.KindUnavailable},
		{"execution limit", 400, `{"__type":"ExecutionLimitExceeded","message":"x"}`, agent.KindUnavailable},
		{"service error", 500, `{"__type":"InternalFailure","message":"x"}`, agent.KindUnavailable},
		{"unavailable", 503, `{"__type":"ServiceUnavailable","message":"x"}`, agent.KindUnavailable},
		{"no state machine", 400, `{"__type":"StateMachineDoesNotExist","message":"x"}`, agent.KindInternal},
		{"invalid name", 400, `{"__type":"InvalidName","message":"x"}`, agent.KindInternal},
		{"access denied", 400, `{"__type":"AccessDeniedException","message":"x"}`, agent.KindInternal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t, tc.status, tc.body)
			err := s.Start(context.Background(), agent.Job{ID: "job_1", ThreadID: "thr_1"})
			switch {
			case tc.want == -1 && err != nil:
				t.Fatalf("Start: %v, want success", err)
			case tc.want != -1 && !agent.IsKind(err, tc.want):
				t.Fatalf("Start: %v (kind %v), want kind %v", err, agent.KindOf(err), tc.want)
			case tc.want == agent.KindUnavailable && agent.CodeOf(err) != agent.CodeJobsUnavailable:
				t.Fatalf("Start: code %s, want %s", agent.CodeOf(err), agent.CodeJobsUnavailable)
			}
		})
	}
}

// No answer at all is unavailable; the caller's context ending is canceled.
func TestTransportErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	s := sfn.New(client(url), machineARN)
	if err := s.Start(context.Background(), agent.Job{ID: "job_1", ThreadID: "thr_1"}); !agent.IsKind(err, agent.KindUnavailable) {
		t.Fatalf("Start against a closed port: %v, want KindUnavailable", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Start(ctx, agent.Job{ID: "job_1", ThreadID: "thr_1"}); !agent.IsKind(err, agent.KindCanceled) {
		t.Fatalf("Start with a canceled context: %v, want KindCanceled", err)
	}
}

// A job id that is no execution name is refused before any request.
func TestRefusesBadNames(t *testing.T) {
	t.Parallel()
	s, sent := setup(t, 200, started)
	for _, id := range []string{"", "job/1", "job 1", strings.Repeat("j", 81)} {
		if err := s.Start(context.Background(), agent.Job{ID: id, ThreadID: "thr_1"}); agent.CodeOf(err) != agent.CodeInvalidJob {
			t.Errorf("Start(%q): %v, want %s", id, err, agent.CodeInvalidJob)
		}
	}
	if n := len(sent()); n != 0 {
		t.Fatalf("%d requests sent for refused names", n)
	}
}

// Wake names are valid execution names, the same for the same (thread, key), different otherwise, and never
// a job id.
func TestWakeName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 200)
	cases := []struct{ thread, key string }{
		{"thr_1", "run_1"}, {"thr_1", "run_2"}, {"thr_2", "run_1"},
		{"thr_1", "a/b c"}, {"thr_1", "a-b-c"}, // the same readable part, different keys
		{"thr_1", long}, {"thr_1", long + "x"},
		{"t", "\x00\xff"},
	}
	seen := map[string]string{}
	for _, tc := range cases {
		name := sfn.WakeName(tc.thread, tc.key)
		if !sfn.ValidName(name) || !strings.HasPrefix(name, "wake_") {
			t.Errorf("WakeName(%q, %q) = %q: not a valid wake execution name", tc.thread, tc.key, name)
		}
		if name != sfn.WakeName(tc.thread, tc.key) {
			t.Errorf("WakeName(%q, %q) is not deterministic", tc.thread, tc.key)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("WakeName(%q, %q) = %q, the name of %s too", tc.thread, tc.key, name, prev)
		}
		seen[name] = tc.thread + "/" + tc.key
	}
	if got := sfn.WakeName("thr_1", "run_1"); !strings.HasPrefix(got, "wake_run_1_") {
		t.Errorf("WakeName keeps no readable key: %q", got)
	}
}
