package webhooks_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/webhooks"
	"github.com/agentloop/agentloop/lib/webhooks/webhookstest"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

var now = time.Date(2031, 3, 4, 5, 6, 7, 891_000_000, time.UTC)

func signal() agent.RunFinished {
	return agent.Finished(agent.Run{ID: "run_1", ThreadID: "th_1", Trigger: agent.TriggerUser, Status: agent.RunFailed,
		Error: &agent.RunError{Code: agent.CodeStale, Message: "The run stopped unexpectedly."}, Model: "m", Steps: 2,
		Usage:     agent.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15, CachedInputTokens: 4, CostMicroUSD: 7},
		CreatedAt: now.Add(-time.Minute), FinishedAt: now}, "alice")
}

// The receiver checks the signature with the Standard Webhooks algorithm written out on its own
// (webhookstest.Verify); the sender's request passes it, with the signal's id and the attempt's timestamp.
func TestSendSigned(t *testing.T) {
	t.Parallel()
	rcv := webhookstest.New(t, 0)
	s, err := webhooks.New(webhooks.Config{URL: rcv.URL, Secret: webhookstest.Secret, Clock: fixedClock{now}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(t.Context(), signal()); err != nil {
		t.Fatal(err)
	}
	reqs := rcv.Requests()
	if len(reqs) != 1 || !reqs[0].Valid {
		t.Fatalf("requests = %+v, want one with a valid signature", reqs)
	}
	r := reqs[0]
	if r.ID != agent.SignalID("run_1") || r.Timestamp != strconv.FormatInt(now.Unix(), 10) {
		t.Fatalf("webhook-id %q, webhook-timestamp %q", r.ID, r.Timestamp)
	}
	var p webhookstest.Payload
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatal(err)
	}
	if p.Type != agent.SignalEvent {
		t.Fatalf("type = %q", p.Type)
	}
	var d agent.SignalDetail
	if err := json.Unmarshal(p.Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.RunID != "run_1" || d.Owner != "alice" || d.Status != "failed" || d.ErrorCode != agent.CodeStale || d.Usage.CachedInputTokens != 4 {
		t.Fatalf("data = %+v", d)
	}
	// A tampered body, another secret, or another id does not verify.
	if webhookstest.Verify(webhookstest.Secret, r.ID, r.Timestamp, r.Signature, append(r.Body, ' ')) ||
		webhookstest.Verify("whsec_"+"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", r.ID, r.Timestamp, r.Signature, r.Body) ||
		webhookstest.Verify(webhookstest.Secret, "msg_other", r.Timestamp, r.Signature, r.Body) {
		t.Fatal("a changed request still verifies")
	}
}

func TestSendFailsOnNon2xx(t *testing.T) {
	t.Parallel()
	rcv := webhookstest.New(t, 1)
	s, err := webhooks.New(webhooks.Config{URL: rcv.URL, Secret: webhookstest.Secret})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(t.Context(), signal()); err == nil {
		t.Fatal("a 500 answer is not an error")
	}
	if err := s.Send(t.Context(), signal()); err != nil {
		t.Fatalf("second attempt: %v", err)
	}
	if n := len(rcv.Delivered()); n != 1 {
		t.Fatalf("delivered %d, want 1", n)
	}
}

func TestCheckURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"https://hooks.example.com/agentloop", true},
		{"http://localhost:8080/hook", true},
		{"http://127.0.0.1:9/hook", true},
		{"http://[::1]:9/hook", true},
		{"http://hooks.example.com/agentloop", false},
		{"http://10.0.0.1/hook", false},
		{"ftp://example.com", false},
		{"/relative", false},
		{"", false},
	} {
		if err := webhooks.CheckURL(tc.url); (err == nil) != tc.ok {
			t.Errorf("CheckURL(%q) = %v, want ok %v", tc.url, err, tc.ok)
		}
	}
}

func TestParseSecret(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		secret string
		ok     bool
	}{
		{webhookstest.Secret, true},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", true}, // no prefix: base64 all the same
		{"whsec_c2hvcnQ=", false},                  // 5 bytes
		{"whsec_not base64!", false},
		{"", false},
	} {
		if _, err := webhooks.ParseSecret(tc.secret); (err == nil) != tc.ok {
			t.Errorf("ParseSecret(%q) = %v, want ok %v", tc.secret, err, tc.ok)
		}
	}
}
