package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/threads"
)

// errNotFound is a 404 (a thread that does not exist).
var errNotFound = errors.New("not found")

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
		err := fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, errorCode(resp.Body))
		if resp.StatusCode == http.StatusNotFound {
			err = fmt.Errorf("%w: %w", errNotFound, err)
		}
		return err
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
	if errors.Is(err, errNotFound) && !slices.ContainsFunc(c.msgs, func(m sent) bool { return m.accepted }) {
		return nil, 0 // every message refused: the thread was never created
	}
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

// The final waves prove that the dead runs gave back what they held: as many final runs as one user may have
// going at once (engine.DefaultMaxActiveRunsPerUser), each followed by as many readers as that user may have
// (threads.DefaultMaxStreamsPerUser, shared among them). Nothing else runs by then, so a 429 is a slot or a
// reader lease still held by a run that ended.
const (
	finalWave      = engine.DefaultMaxActiveRunsPerUser
	finalReaders   = threads.DefaultMaxStreamsPerUser / finalWave
	finalText      = "/slow 20" // two seconds: long enough for the readers to attach
	finalRetryTime = 90 * time.Second
)

// finalCounts is what the final waves saw.
type finalCounts struct {
	mu       sync.Mutex
	answered int
	runs429  int // final messages refused too_many_runs
	readers  int // readers that attached (200)
	reads429 int // readers refused too_many_streams
	findings []string
}

func (f *finalCounts) add(fn func(f *finalCounts)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// finals sends every thread one more message, finalWave threads at once, each with finalReaders readers, and
// expects every message to be answered with a completed reply and no 429.
func (a api) finals(ctx context.Context, cs []*client, tl *tally) *finalCounts {
	f := &finalCounts{}
	for i := 0; i < len(cs); i += finalWave {
		var wg sync.WaitGroup
		for _, c := range cs[i:min(i+finalWave, len(cs))] {
			fc := *c
			fc.tally = tl
			done := make(chan struct{})
			wg.Go(func() {
				defer close(done)
				a.finalMessage(ctx, &fc, f)
			})
			for range finalReaders {
				wg.Go(func() { a.finalReader(ctx, &fc, done, f) })
			}
		}
		wg.Wait()
	}
	return f
}

// finalMessage posts the thread's final message; a 429 is a finding, then waited out (at most finalRetryTime).
func (a api) finalMessage(ctx context.Context, c *client, f *finalCounts) {
	deadline := time.Now().Add(finalRetryTime)
	for {
		out := c.post(ctx, c.thread, c.thread+"-final", finalText)
		var finding string
		switch {
		case out.reply == replyCompleted:
			f.add(func(f *finalCounts) { f.answered++ })
			return
		case out.status == http.StatusTooManyRequests:
			f.add(func(f *finalCounts) {
				if f.runs429++; f.runs429 == 1 {
					f.findings = append(f.findings, fmt.Sprintf("%s: final message refused %s: a run slot is still held after every run ended", c.thread, out.code))
				}
			})
			if time.Now().Before(deadline) {
				time.Sleep(time.Second)
				continue
			}
			finding = fmt.Sprintf("%s: final message refused %s for %s", c.thread, out.code, finalRetryTime)
		case out.status == 0:
			finding = fmt.Sprintf("%s: final message: no answer", c.thread)
		case out.status == http.StatusOK:
			finding = fmt.Sprintf("%s: final message: reply %s", c.thread, replyName(out.reply))
		default:
			finding = fmt.Sprintf("%s: final message refused: %d %s", c.thread, out.status, out.code)
		}
		f.add(func(f *finalCounts) { f.findings = append(f.findings, finding) })
		return
	}
}

// finalReader attaches to the thread's final run (GET /chat/{id}/stream) until it has read it once, or the run
// is over; 204 before the run has begun is tried again.
func (a api) finalReader(ctx context.Context, c *client, done <-chan struct{}, f *finalCounts) {
	for {
		select {
		case <-done:
			return
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/chat/"+c.thread+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+a.token)
		resp, err := a.http.Do(req)
		if err != nil {
			f.add(func(f *finalCounts) {
				f.findings = append(f.findings, fmt.Sprintf("%s: final reader: %v", c.thread, err))
			})
			return
		}
		status, code := resp.StatusCode, ""
		if status == http.StatusOK {
			_, _ = io.Copy(io.Discard, resp.Body)
		} else {
			code = errorCode(resp.Body)
		}
		resp.Body.Close()
		switch status {
		case http.StatusOK:
			f.add(func(f *finalCounts) { f.readers++ })
			return
		case http.StatusNoContent:
			time.Sleep(50 * time.Millisecond)
		case http.StatusTooManyRequests:
			f.add(func(f *finalCounts) {
				f.reads429++
				f.findings = append(f.findings, fmt.Sprintf("%s: final reader refused %s", c.thread, code))
			})
			return
		default:
			f.add(func(f *finalCounts) {
				f.findings = append(f.findings, fmt.Sprintf("%s: final reader: %d %s", c.thread, status, code))
			})
			return
		}
	}
}

func replyName(r replyResult) string {
	return [...]string{"none", "completed", "failed", "cut"}[r]
}
