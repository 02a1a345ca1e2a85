package benchmarks

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/sqlite"
)

// Resumed streams (issue 18 item 4): the lag of a resumed reader, from the model emitting a word (the offline
// model's write of it, timestamped by a wrapper of the model endpoint) to the reader reading it, p50 and p99 over
// ALL the words emitted after the reader attached ("resumed"), beside the lag of the reply's own (live) client over
// the same words. Each reply is /slow resumeWords (a word every 100 ms); the reader attaches once resumeAttachAfter
// words were read live. "attach" is the words emitted in the first resumeSettle after the attach, "settled" the
// rest: a reader in another process hurries the writer only once the writer's keeper has read its mark, from its
// reader probe (every AGENT_READER_PROBE, 100 ms) or else from its next heartbeat batch (AGENT_HEARTBEAT, 1 s).
//
//   - same-process-sqlite: `agentloop dev`'s composition; the reader is fed by the writer's Segmenter (segments.Hub).
//   - across-processes-sqlite: two stacks over one SQLite file (each its own store, engine, thread service); the
//     writer's keeper probes for readers every 100 ms (the default).
//   - across-processes-sqlite-probe-50ms: the same, probing every 50 ms.
//   - across-processes-sqlite-no-probe: AGENT_READER_PROBE=0: the writer learns of the reader from its heartbeat
//     batch only (before the probe).
//   - across-processes-sqlite-no-presence: the reader's presence mark dropped, so the writer never hurries: what
//     a reader elsewhere saw before presence (a segment every 500 ms).
//   - across-processes-dynamo, -probe-50ms, -no-probe: two stacks over one dynalite table, each its own client;
//     also the capacity units per streaming second with and without the reader: the writer's (its segments,
//     keeper batches and reader probes) and the reader's (its presence marks and polls).
//
// Numbers only; nothing here asserts a time.
const (
	resumeWords       = 60
	resumeAttachAfter = 10
	resumeSettle      = 1500 * time.Millisecond
)

var wordRE = regexp.MustCompile(`word(\d+)`)

// emitted timestamps each word of the current reply as the model endpoint writes it.
type emitted struct {
	mu sync.Mutex
	at map[int]time.Time
}

func (e *emitted) reset() {
	e.mu.Lock()
	e.at = map[int]time.Time{}
	e.mu.Unlock()
}

func (e *emitted) get(k int) (time.Time, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	t, ok := e.at[k]
	return t, ok
}

type emitWriter struct {
	http.ResponseWriter
	e *emitted
}

func (w emitWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	now := time.Now()
	w.e.mu.Lock()
	for _, m := range wordRE.FindAllSubmatch(p, -1) {
		if k, err := strconv.Atoi(string(m[1])); err == nil {
			if _, ok := w.e.at[k]; !ok {
				w.e.at[k] = now
			}
		}
	}
	w.e.mu.Unlock()
	return n, err
}

func (w emitWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// emitting wraps the stack's model endpoint with e.
func emitting(e *emitted) func(*devserver.Options, *probe) {
	return func(_ *devserver.Options, p *probe) {
		inner := p.model
		p.model = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(emitWriter{ResponseWriter: w, e: e}, r)
		})
	}
}

// readWords reads an SSE stream and timestamps each word's first arrival; attach, when set, is closed once
// attachAfter words arrived.
func readWords(resp *http.Response, attachAfter int, attach chan struct{}) (map[int]time.Time, bool) {
	defer resp.Body.Close()
	got := map[int]time.Time{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		now := time.Now()
		if bytes.Contains(line, []byte(`"type":"text-delta"`)) {
			for _, m := range wordRE.FindAllSubmatch(line, -1) {
				if k, err := strconv.Atoi(string(m[1])); err == nil {
					if _, ok := got[k]; !ok {
						got[k] = now
					}
				}
			}
			if attach != nil && len(got) == attachAfter {
				close(attach)
				attach = nil
			}
		}
		if bytes.Equal(line, []byte("data: [DONE]")) {
			done = true
		}
	}
	if attach != nil {
		close(attach)
	}
	return got, done
}

// resumeLag runs b.N replies on run, each resumed from read, and reports the lags.
func resumeLag(b *testing.B, run, read *stack, e *emitted) {
	var live, resumed, early, settled []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e.reset()
		thread := fmt.Sprintf("resume%d", i)
		resp := run.post(b, "/chat", chat(thread, "m", fmt.Sprintf("/slow %d", resumeWords)))
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("POST /chat: %d", resp.StatusCode)
		}
		attach := make(chan struct{})
		type result struct {
			got  map[int]time.Time
			done bool
		}
		liveCh := make(chan result, 1)
		go func() { got, done := readWords(resp, resumeAttachAfter, attach); liveCh <- result{got, done} }()
		<-attach
		attachedAt := time.Now()
		req, _ := http.NewRequest("GET", read.url+"/chat/"+thread+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+read.token)
		rresp, err := http.DefaultClient.Do(req)
		if err != nil || rresp.StatusCode != http.StatusOK {
			b.Fatalf("GET stream: %v %v", err, rresp)
		}
		rgot, rdone := readWords(rresp, 0, nil)
		l := <-liveCh
		if !rdone || !l.done || len(rgot) != resumeWords || len(l.got) != resumeWords {
			b.Fatalf("reply %d: live %d words (done %v), resumed %d words (done %v)", i, len(l.got), l.done, len(rgot), rdone)
		}
		for k := 1; k <= resumeWords; k++ {
			em, ok := e.get(k)
			if !ok || em.Before(attachedAt) {
				continue
			}
			live = append(live, l.got[k].Sub(em))
			resumed = append(resumed, rgot[k].Sub(em))
			if em.Sub(attachedAt) >= resumeSettle {
				settled = append(settled, rgot[k].Sub(em))
			} else {
				early = append(early, rgot[k].Sub(em))
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(pct(live, 0.50)/1000, "live-p50-ms")
	b.ReportMetric(pct(live, 0.99)/1000, "live-p99-ms")
	b.ReportMetric(pct(resumed, 0.50)/1000, "resumed-p50-ms")
	b.ReportMetric(pct(resumed, 0.99)/1000, "resumed-p99-ms")
	if len(early) > 0 {
		b.ReportMetric(pct(early, 0.50)/1000, "attach-p50-ms")
		b.ReportMetric(pct(early, 0.99)/1000, "attach-p99-ms")
	}
	if len(settled) > 0 {
		b.ReportMetric(pct(settled, 0.50)/1000, "settled-p50-ms")
		b.ReportMetric(pct(settled, 0.99)/1000, "settled-p99-ms")
	}
}

// noPresence drops the reader's presence marks (the writer never learns of the reader).
type noPresence struct{ agent.Store }

func (noPresence) MarkReader(context.Context, string, string, time.Time) error { return nil }

// sharedSQLite opens another store over the file at path, for another "process".
func sharedSQLite(b *testing.B, path string, wrap func(agent.Store) agent.Store) agent.Store {
	st, err := sqlite.Open(context.Background(), path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	if wrap != nil {
		return wrap(st)
	}
	return st
}

// resumeCost streams one /slow reply on run for its whole length, with a reader on read attached from its start or
// none, and reports the DynamoDB capacity units per streaming second of the writer's and the reader's clients.
func resumeCost(b *testing.B, run, read *stack, wc, rc *dynamo.Counter, reader bool, name string) {
	thread := "cost-" + name
	w0, r0 := wc.Counts(), rc.Counts()
	start := time.Now()
	resp := run.post(b, "/chat", chat(thread, "m", fmt.Sprintf("/slow %d", resumeWords)))
	attach := make(chan struct{})
	liveCh := make(chan bool, 1)
	go func() { _, done := readWords(resp, 1, attach); liveCh <- done }()
	<-attach
	if reader {
		req, _ := http.NewRequest("GET", read.url+"/chat/"+thread+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+read.token)
		rresp, err := http.DefaultClient.Do(req)
		if err != nil || rresp.StatusCode != http.StatusOK {
			b.Fatalf("GET stream: %v %v", err, rresp)
		}
		readWords(rresp, 0, nil)
	}
	<-liveCh
	secs := time.Since(start).Seconds()
	w1, r1 := wc.Counts(), rc.Counts()
	b.ReportMetric((w1.TableWriteUnits+w1.IndexWriteUnits-w0.TableWriteUnits-w0.IndexWriteUnits)/secs, name+"-writer-WCU/s")
	b.ReportMetric((r1.TableWriteUnits+r1.IndexWriteUnits-r0.TableWriteUnits-r0.IndexWriteUnits)/secs, name+"-reader-WCU/s")
	b.ReportMetric((w1.ReadUnits-w0.ReadUnits)/secs, name+"-writer-RCU/s")
	b.ReportMetric((r1.ReadUnits-r0.ReadUnits)/secs, name+"-reader-RCU/s")
	b.ReportMetric(float64(w1.ByOperation["PutItem"]-w0.ByOperation["PutItem"])/secs, name+"-writer-segment-puts/s")
}

// BenchmarkResume: resumed-stream lag in the writer's process and across processes (the doc above). make bench
// runs 5 replies per case.
func BenchmarkResume(b *testing.B) {
	b.Run("same-process-sqlite", func(b *testing.B) {
		e := &emitted{}
		s := setup(b, nil, nil, stopConfig(), emitting(e))
		resumeLag(b, s, s, e)
	})
	// probing is the writer's config with AGENT_READER_PROBE at probe (0: the default; -1: none).
	probing := func(probe time.Duration) config.Config {
		c := stopConfig()
		c.ReaderProbe = probe
		return c
	}
	across := func(b *testing.B, probe time.Duration, wrap func(agent.Store) agent.Store) {
		path := filepath.Join(b.TempDir(), "shared.db")
		e := &emitted{}
		runner := setup(b, sharedSQLite(b, path, nil), nil, probing(probe), emitting(e))
		reader := setup(b, sharedSQLite(b, path, wrap), nil, stopConfig())
		reader.token = runner.token
		resumeLag(b, runner, reader, e)
	}
	b.Run("across-processes-sqlite", func(b *testing.B) { across(b, 0, nil) })
	b.Run("across-processes-sqlite-probe-50ms", func(b *testing.B) { across(b, 50*time.Millisecond, nil) })
	b.Run("across-processes-sqlite-no-probe", func(b *testing.B) { across(b, -1, nil) })
	b.Run("across-processes-sqlite-no-presence", func(b *testing.B) {
		across(b, 0, func(s agent.Store) agent.Store { return noPresence{s} })
	})
	dynamoAcross := func(b *testing.B, probe time.Duration, withReader bool) {
		endpoint := dynamotest.Start(b)
		table := fmt.Sprintf("resume_%d", time.Now().UnixNano())
		if err := dynamotest.CreateTable(context.Background(), dynamotest.Client(endpoint), table); err != nil {
			b.Fatal(err)
		}
		counted := func() (*dynamodb.Client, *dynamo.Counter) {
			c := &dynamo.Counter{}
			return dynamotest.Client(endpoint, func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, c.Register) }), c
		}
		wclient, wc := counted()
		rclient, rc := counted()
		e := &emitted{}
		runner := setup(b, dynamo.New(wclient, table), nil, probing(probe), emitting(e))
		reader := setup(b, dynamo.New(rclient, table), nil, stopConfig())
		reader.token = runner.token
		resumeLag(b, runner, reader, e)
		resumeCost(b, runner, reader, wc, rc, false, "alone")
		if withReader {
			resumeCost(b, runner, reader, wc, rc, true, "read")
		}
	}
	b.Run("across-processes-dynamo", func(b *testing.B) { dynamoAcross(b, 0, true) })
	b.Run("across-processes-dynamo-probe-50ms", func(b *testing.B) { dynamoAcross(b, 50*time.Millisecond, false) })
	b.Run("across-processes-dynamo-no-probe", func(b *testing.B) { dynamoAcross(b, -1, true) })
}
