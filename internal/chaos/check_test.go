package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// api is the harness's reader of the thread routes.
type api struct {
	base, token string
	http        *http.Client
}

func (a api) get(ctx context.Context, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, errorCode(resp.Body))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

type pageInfo struct {
	NextCursor string
	HasMore    bool
}

type threadView struct {
	Thread struct {
		ActiveRun *struct{ RunID string } `json:"activeRun"`
	}
	Messages []struct {
		ID   string
		Role string
	}
	Page pageInfo
}

// messages reads every message of a thread, oldest first, and whether a run holds its claim.
func (a api) messages(ctx context.Context, thread string) (ids, roles []string, claimed bool, err error) {
	cursor := ""
	for first := true; first || cursor != ""; first = false {
		q := url.Values{"limit": {"500"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var v threadView
		if err := a.get(ctx, "/threads/"+url.PathEscape(thread)+"?"+q.Encode(), &v); err != nil {
			return nil, nil, false, err
		}
		if first {
			claimed = v.Thread.ActiveRun != nil
		}
		for _, m := range v.Messages {
			ids, roles = append(ids, m.ID), append(roles, m.Role)
		}
		cursor = ""
		if v.Page.HasMore {
			cursor = v.Page.NextCursor
		}
	}
	return ids, roles, claimed, nil
}

// runs reads every run of a thread: how many, and how many have not ended.
func (a api) runs(ctx context.Context, thread string) (total, open int, err error) {
	cursor := ""
	for first := true; first || cursor != ""; first = false {
		q := url.Values{"limit": {"500"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var v struct {
			Runs []struct{ ID, Status string }
			Page pageInfo
		}
		if err := a.get(ctx, "/threads/"+url.PathEscape(thread)+"/runs?"+q.Encode(), &v); err != nil {
			return 0, 0, err
		}
		for _, r := range v.Runs {
			total++
			if !agent.RunStatus(r.Status).Terminal() {
				open++
			}
		}
		cursor = ""
		if v.Page.HasMore {
			cursor = v.Page.NextCursor
		}
	}
	return total, open, nil
}

// settle waits until no thread has a claim or a run that has not ended (the reaper's work after the last kill),
// at most timeout; it returns how long that took and the threads still open.
func (a api) settle(ctx context.Context, threads []string, timeout time.Duration) (time.Duration, []string) {
	began := time.Now()
	for {
		var open []string
		for _, th := range threads {
			_, _, claimed, err := a.messages(ctx, th)
			_, running, rerr := a.runs(ctx, th)
			if err != nil || rerr != nil || claimed || running > 0 {
				open = append(open, th)
			}
		}
		if len(open) == 0 || time.Since(began) > timeout {
			return time.Since(began), open
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkThread compares what a thread stores with what its client sent; it returns the findings.
func (a api) checkThread(ctx context.Context, c *client) (findings []string, runs int) {
	ids, roles, claimed, err := a.messages(ctx, c.thread)
	if err != nil {
		return []string{fmt.Sprintf("%s: read messages: %v", c.thread, err)}, 0
	}
	if claimed {
		findings = append(findings, fmt.Sprintf("%s: still claimed after settling", c.thread))
	}
	sentAt := map[string]int{}
	for i, m := range c.msgs {
		sentAt[m.id] = i
	}
	stored := map[string]int{}
	last := -1
	for i, id := range ids {
		if roles[i] != string(agent.RoleUser) {
			continue
		}
		stored[id]++
		at, ours := sentAt[id]
		switch {
		case !ours:
			findings = append(findings, fmt.Sprintf("%s: user message %s was never sent", c.thread, id))
		case at < last:
			findings = append(findings, fmt.Sprintf("%s: user message %s stored out of order", c.thread, id))
		default:
			last = at
		}
		if i+1 >= len(ids) || roles[i+1] != string(agent.RoleAssistant) {
			findings = append(findings, fmt.Sprintf("%s: user message %s has no reply after it (message %d of %d)", c.thread, id, i+1, len(ids)))
		}
	}
	for _, m := range c.msgs {
		switch n := stored[m.id]; {
		case n > 1:
			findings = append(findings, fmt.Sprintf("%s: message %s stored %d times", c.thread, m.id, n))
		case n == 0 && m.accepted:
			findings = append(findings, fmt.Sprintf("%s: accepted message %s is lost", c.thread, m.id))
		}
	}
	runs, open, err := a.runs(ctx, c.thread)
	if err != nil {
		return append(findings, fmt.Sprintf("%s: read runs: %v", c.thread, err)), runs
	}
	if open > 0 {
		findings = append(findings, fmt.Sprintf("%s: %d of %d runs not ended after settling", c.thread, open, runs))
	}
	return findings, runs
}

// final sends each thread one more message, one thread at a time, and expects a completed reply; a 429 is
// waited out (its Retry-After) and counted, for at most a lease's TTL.
func (a api) final(ctx context.Context, c *client) (limited int, finding string) {
	id := c.thread + "-final"
	deadline := time.Now().Add(90 * time.Second)
	for {
		out := c.post(ctx, c.thread, id, "final check")
		switch {
		case out.reply == replyCompleted:
			return limited, ""
		case out.status == http.StatusTooManyRequests && time.Now().Before(deadline):
			limited++
			time.Sleep(time.Second)
		case out.status == 0:
			return limited, fmt.Sprintf("%s: final message: no answer", c.thread)
		case out.status == http.StatusOK:
			return limited, fmt.Sprintf("%s: final message: reply %s", c.thread, replyName(out.reply))
		default:
			return limited, fmt.Sprintf("%s: final message refused: %s %s", c.thread, strconv.Itoa(out.status), out.code)
		}
	}
}

func replyName(r replyResult) string {
	return [...]string{"none", "completed", "failed", "cut"}[r]
}
