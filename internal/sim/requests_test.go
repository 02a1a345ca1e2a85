package sim

import (
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// Faults below the store interface (DynamoDB only). One store call of the DynamoDB adapter may make several
// requests (FinishRun releases the claim and then records the outcome; PutMessage reads, writes parts and the
// item; DeleteThread deletes in batches; ...), and a Lambda can die, or lose an answer, between any two of them.
// procStore's faults hit a whole call; these hit one request of a write call:
//
//   - a transient failure before the request is sent, or a lost answer after it applied: both are connection
//     errors the SDK's own retryer retries (its backoff is zero here, so no real time passes), and three in a
//     row exhaust its attempts, so the adapter returns KindUnavailable part way through the method;
//   - a crash before the request is sent or after it applied: the process dies there, between two writes of
//     one method.
//
// The fates are drawn from a stream of their own (reqRng), so a schedule whose processes draw no request fault
// plays exactly as before, and the SQLite half of every seed is unchanged.

// procStores is a base store that can give each process a store of its own (over the same data), through which
// the sim reaches that process's requests.
type procStores interface {
	forProc(p *proc) agent.Store
}

// dynamoBase is the DynamoDB base store of the sim: the checks read through the embedded store, each crashable
// process gets a client whose transport the scheduler controls.
type dynamoBase struct {
	*dynamo.Store
	endpoint, table string
	http            *awshttp.BuildableClient
}

func (d dynamoBase) forProc(p *proc) agent.Store {
	if p.reqRate == 0 {
		return d.Store
	}
	c := dynamotest.Client(d.endpoint, func(o *dynamodb.Options) {
		o.HTTPClient = &faultyHTTP{base: d.http, p: p}
		// No real time passes between the SDK's attempts, and no retry quota is shared between processes (or
		// runs out because of another schedule's faults).
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.Backoff = noBackoff{}
			so.RateLimiter = ratelimit.None
		})
	})
	return dynamo.New(c, d.table)
}

type noBackoff struct{}

func (noBackoff) BackoffDelay(int, error) (time.Duration, error) { return 0, nil }

// reqFate is what happens to one request.
type reqFate int

const (
	reqPass        reqFate = iota
	reqFailBefore          // a connection error before the request is sent
	reqLostAfter           // the request applied; its answer is lost (a connection error)
	reqCrashBefore         // the process dies before the request is sent
	reqCrashAfter          // the process dies after the request applied
)

func (f reqFate) String() string {
	return [...]string{"pass", "transient fault before it was sent", "answer lost after it applied", "CRASH before it was sent", "CRASH after it applied"}[f]
}

// errConnReset is a transport error the SDK's retryer retries.
type errConnReset struct{}

func (errConnReset) Error() string         { return "sim: injected connection reset" }
func (errConnReset) ConnectionError() bool { return true }

// faultyHTTP is the transport of one process's DynamoDB client.
type faultyHTTP struct {
	base *awshttp.BuildableClient
	p    *proc
}

func (h *faultyHTTP) Do(r *http.Request) (*http.Response, error) {
	p, w := h.p, h.p.w
	if p.isDead() {
		return nil, p.parkDead()
	}
	op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	fate, call, n := p.requestFate()
	switch fate {
	case reqCrashBefore:
		w.tracef("  %s: %s request %d (%s): %s", p.name, call, n, op, fate)
		w.countFault(call + "(request crash)")
		p.store.diedPartWay()
		p.die()
		return nil, p.parkDead()
	case reqFailBefore:
		w.tracef("    %s: %s request %d (%s): %s", p.name, call, n, op, fate)
		w.countFault(call + "(request fault)")
		return nil, errConnReset{}
	}
	resp, err := h.base.Do(r)
	if err != nil || fate == reqPass {
		return resp, err
	}
	status := resp.StatusCode
	_ = resp.Body.Close()
	switch fate {
	case reqCrashAfter:
		w.tracef("  %s: %s request %d (%s) answered %d: %s", p.name, call, n, op, status, fate)
		w.countFault(call + "(request crash)")
		p.store.diedPartWay()
		p.die()
		return nil, p.parkDead()
	default:
		w.tracef("    %s: %s request %d (%s) answered %d: %s", p.name, call, n, op, status, fate)
		w.countFault(call + "(request lost)")
		return nil, errConnReset{}
	}
}

// requestFate draws the fate of the process's next request: none outside a write call that may fault (see
// nextCall), no crash for a process that may not crash.
func (p *proc) requestFate() (reqFate, string, int) {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.reqCall == "" {
		return reqPass, "", 0
	}
	p.reqN++
	if p.reqRng.Float64() >= p.reqRate {
		p.reqStreak = 0
		return reqPass, p.reqCall, p.reqN
	}
	f := reqFate(1 + p.reqRng.IntN(4))
	// DynamoDB's FinishRun releases the claim and then records the outcome in a second write; a process that dies
	// between them, or whose second write fails for good, leaves a claimless `running` run, which the reaper's
	// orphan sweep (or a reader) finishes, also after a later run continued its reply (seed 1000019,
	// gapRegressions). Its requests draw every fate, like any write's.
	if !p.crashable && (f == reqCrashBefore || f == reqCrashAfter) {
		f -= 2
	}
	p.reqStreak++
	call := p.reqCall
	if f == reqCrashBefore || f == reqCrashAfter {
		p.reqCall = "" // the process is dead: its goroutines' requests (if any) draw nothing more
	}
	return f, call, p.reqN
}

// drawRequestFaults decides whether the process sees request faults (DynamoDB only), from the request stream.
func (p *proc) drawRequestFaults(crashable bool) {
	p.crashable = crashable
	p.reqRng = rand.New(rand.NewPCG(p.w.seed^0x72657175657374, uint64(p.id)))
	if _, ok := p.w.base.(procStores); !ok || !crashable {
		return
	}
	if p.reqRng.Float64() < 0.3 {
		p.reqRate = []float64{0.05, 0.15, 0.3}[p.reqRng.IntN(3)]
	}
}

// inRequests opens (method != "") or closes the window in which the process's requests draw fates.
func (p *proc) inRequests(method string) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if p.reqRate == 0 {
		return
	}
	p.reqCall, p.reqN, p.reqStreak = method, 0, 0
}
