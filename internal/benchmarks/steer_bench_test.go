package benchmarks

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// Sub-agent jobs through the whole local stack (HTTP, engine, the in-process job runner with the state machine's
// contract, the research sub-agent on the offline model): how long a finished job's result takes to show in its
// thread, and what a delivered job costs the store. The Step Functions hop between the sub-agent task and the
// wake (a state transition and a Lambda invocation in AWS) is not in these numbers: the local runner calls the
// wake at once (lib/sfn BenchmarkExecution measures that hop on sfnlocal).

// idle: a job finishes while its thread is idle; the wake claims the thread and runs the steer turn.
func (js *jobStack) idle(b *testing.B) (toSteer, toReply time.Duration) {
	thread := js.thread("idle")
	js.dispatch(b, thread)
	m := js.settle(b, thread)
	return m.steer.Sub(m.result), m.reply.Sub(m.result)
}

// busy: a job's steer is queued while a run holds the thread; the run is let go, and its end asks for the
// delivery pass that stores the steer and answers it.
func (js *jobStack) busy(b *testing.B) (toSteer, endToSteer, toReply time.Duration) {
	thread := js.thread("busy")
	letGo := make(chan struct{})
	js.mu.Lock()
	js.letGo = letGo
	js.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(js.request(chat(thread, "u-hold", "/tool hold {}")))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-js.holding
	js.deliverQueued(b, js.finishedJob(b, thread))
	released := time.Now()
	close(letGo)
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	m := js.settle(b, thread)
	return m.steer.Sub(released), m.steer.Sub(m.runEnd), m.reply.Sub(released)
}

// coalesced: a job's steer is queued while the thread asks for an approval; the user's next message takes it
// (one turn answers both).
func (js *jobStack) coalesced(b *testing.B) (toSteer, toReply time.Duration) {
	thread := js.thread("ask")
	js.turn(b, thread, "u-ask", `/tool guarded {"n":1}`)
	js.deliverQueued(b, js.finishedJob(b, thread))
	js.turn(b, thread, "u-next", "never mind, go on")
	js.probe.mu.Lock()
	received := js.probe.received
	js.probe.mu.Unlock()
	m := js.settle(b, thread)
	return m.steer.Sub(received), m.reply.Sub(received)
}

// runSteer runs the three cases b.N times each on one stack.
func runSteer(b *testing.B, js *jobStack) {
	b.Run("idle", func(b *testing.B) {
		var steer, reply []time.Duration
		for range b.N {
			s, r := js.idle(b)
			steer, reply = append(steer, s), append(reply, r)
		}
		b.ReportMetric(pctMs(steer, 0.50), "p50-result-to-steer-ms")
		b.ReportMetric(pctMs(steer, 0.99), "p99-result-to-steer-ms")
		b.ReportMetric(pctMs(reply, 0.50), "p50-result-to-reply-ms")
		b.ReportMetric(pctMs(reply, 0.99), "p99-result-to-reply-ms")
	})
	b.Run("busy", func(b *testing.B) {
		var steer, fromEnd, reply []time.Duration
		for range b.N {
			s, e, r := js.busy(b)
			steer, fromEnd, reply = append(steer, s), append(fromEnd, e), append(reply, r)
		}
		b.ReportMetric(pctMs(steer, 0.50), "p50-release-to-steer-ms")
		b.ReportMetric(pctMs(steer, 0.99), "p99-release-to-steer-ms")
		b.ReportMetric(pctMs(fromEnd, 0.50), "p50-run-end-to-steer-ms")
		b.ReportMetric(pctMs(fromEnd, 0.99), "p99-run-end-to-steer-ms")
		b.ReportMetric(pctMs(reply, 0.50), "p50-release-to-reply-ms")
		b.ReportMetric(pctMs(reply, 0.99), "p99-release-to-reply-ms")
	})
	b.Run("coalesced", func(b *testing.B) {
		var steer, reply []time.Duration
		for range b.N {
			s, r := js.coalesced(b)
			steer, reply = append(steer, s), append(reply, r)
		}
		b.ReportMetric(pctMs(steer, 0.50), "p50-message-to-steer-ms")
		b.ReportMetric(pctMs(steer, 0.99), "p99-message-to-steer-ms")
		b.ReportMetric(pctMs(reply, 0.50), "p50-message-to-reply-ms")
		b.ReportMetric(pctMs(reply, 0.99), "p99-message-to-reply-ms")
	})
}

// BenchmarkSteerSQLite: from a job's result to its steer in the thread, on SQLite: an idle thread (the wake's
// own turn), a busy one (the pass its run's end asks for), and one that asks a question (coalesced into the
// user's next message). Each case runs b.N times.
func BenchmarkSteerSQLite(b *testing.B) { runSteer(b, newJobStack(b, false, false)) }

// BenchmarkSteerDynamo: the same on dynalite.
func BenchmarkSteerDynamo(b *testing.B) { runSteer(b, newJobStack(b, true, false)) }
