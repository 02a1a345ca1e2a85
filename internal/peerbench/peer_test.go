package peerbench

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
)

// The fake model's reply (issue 18): 200 words, one every 5 ms.
const (
	replyWords = 200
	wordEvery  = 5 * time.Millisecond
)

// load is N concurrent streams, R rounds of them.
type load struct{ streams, rounds int }

func (l load) String() string {
	if l.rounds > 1 {
		return fmt.Sprintf("%d streams × %d", l.streams, l.rounds)
	}
	return fmt.Sprintf("%d streams", l.streams)
}

func parseLoads(s string) ([]load, error) {
	var out []load
	for _, f := range strings.Split(s, ",") {
		n, r, _ := strings.Cut(strings.TrimSpace(f), "x")
		l := load{rounds: 1}
		var err error
		if l.streams, err = strconv.Atoi(n); err != nil || l.streams < 1 {
			return nil, fmt.Errorf("PEERBENCH_LOADS: bad load %q", f)
		}
		if r != "" {
			if l.rounds, err = strconv.Atoi(r); err != nil || l.rounds < 1 {
				return nil, fmt.Errorf("PEERBENCH_LOADS: bad load %q", f)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// result is one server's run of one load.
type result struct {
	server     string
	load       load
	streams    int // streams sent (N × R)
	failed     int // streams with an error
	errors     map[string]int
	words      int64
	cpu        time.Duration
	wall       time.Duration
	lat        []int32         // every word's latency, µs, sorted
	first      []time.Duration // each stream's POST → first word, sorted
	peakRSS    int64
	loadavg    string
	stored     *outcomes // agentloop only
	storedErr  error
	modelCalls int64 // requests the fake model streamed during the load
	lateWrites int64 // the fake model's writes more than lagLimit behind its schedule
	maxLag     time.Duration
	// procStatements is every SQL statement the agentloop process made in its life (its "store totals" log line
	// at exit: the warm-up and the outcome reads included, and the per-process work no run's context counts);
	// -1 when the line is missing.
	procStatements int64
}

func (r *result) cpuPerWord() time.Duration {
	if r.words == 0 {
		return 0
	}
	return r.cpu / time.Duration(r.words)
}

func (r *result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return time.Duration(r.lat[rank(len(r.lat), p)]) * time.Microsecond
}

func (r *result) firstPct(p float64) time.Duration {
	if len(r.first) == 0 {
		return 0
	}
	return r.first[rank(len(r.first), p)]
}

// rank is the index of the p quantile in a sorted slice of n.
func rank(n int, p float64) int { return min(n-1, int(float64(n)*p)) }

// TestPeerBench is the peer benchmark (see the package doc). make bench-peer runs it with PEERBENCH=1.
func TestPeerBench(t *testing.T) {
	if os.Getenv("PEERBENCH") != "1" {
		t.Skip("the peer benchmark runs with PEERBENCH=1 (make bench-peer, part of make bench)")
	}
	loads, err := parseLoads(cmp.Or(os.Getenv("PEERBENCH_LOADS"), "20x3,200,1000"))
	if err != nil {
		t.Fatal(err)
	}
	servers := strings.Split(cmp.Or(os.Getenv("PEERBENCH_SERVERS"), "agentloop,aisdk"), ",")
	maxStreams := 0
	for _, l := range loads {
		maxStreams = max(maxStreams, l.streams)
	}
	raiseFileLimit(t, 3*maxStreams+256)

	dir := t.TempDir()
	var bin, node string
	for _, s := range servers {
		switch s {
		case "agentloop":
			if bin, err = testenv.BuildAgentloop(dir); err != nil {
				t.Fatal(err)
			}
		case "aisdk":
			if _, err := os.Stat(filepath.Join("aisdk", "node_modules", "ai", "package.json")); err != nil {
				t.Fatal("aisdk/node_modules is not installed: run make bench-peer (it runs npm ci in internal/peerbench/aisdk)")
			}
			if node, err = exec.LookPath(cmp.Or(os.Getenv("NODE"), "node")); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(node, "--version").Output()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("aisdk on node %s", strings.TrimSpace(string(out)))
		default:
			t.Fatalf("PEERBENCH_SERVERS: unknown server %q (agentloop, aisdk)", s)
		}
	}

	ctx := context.Background()
	epoch := time.Now()
	model, err := startFakeModel(epoch, replyWords, wordEvery)
	if err != nil {
		t.Fatal(err)
	}
	defer model.close()

	var results []*result
	for li, l := range loads {
		for _, s := range servers {
			sdir := filepath.Join(dir, fmt.Sprintf("%s-%d", s, li))
			if err := os.MkdirAll(sdir, 0o755); err != nil {
				t.Fatal(err)
			}
			var p *process
			if s == "agentloop" {
				p, err = startAgentloop(ctx, bin, sdir, model.url)
			} else {
				p, err = startAISDK(ctx, node, sdir, model.url)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := runLoad(ctx, t, p, model, l, fmt.Sprintf("%s-%d-%d", s, li, epoch.UnixNano()))
			p.stop()
			if s == "agentloop" {
				r.procStatements = p.storeStatements()
			}
			if r.failed > 0 {
				t.Logf("%s, %s: %d of %d streams failed; the server's log ends:\n%s", s, l, r.failed, r.streams, p.tail(2000))
			}
			results = append(results, r)
			t.Logf("%s, %s: done in %s", s, l, r.wall.Round(time.Millisecond))
		}
	}
	if n := model.refused.Load(); n > 0 {
		t.Errorf("the fake model refused %d requests (not a streaming chat completion)", n)
	}
	printTables(results, loads)
}

// raiseFileLimit sets the soft RLIMIT_NOFILE to the hard one explicitly, so that the servers started from here
// inherit it too (Go raises its own soft limit at start, but gives children the original one unless the
// program sets the limit itself), and fails when even the hard limit is below need.
func raiseFileLimit(t *testing.T, need int) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < uint64(need) {
		t.Fatalf("RLIMIT_NOFILE is %d (hard), the largest load needs about %d file descriptors: raise ulimit -Hn", lim.Cur, need)
	}
	t.Logf("RLIMIT_NOFILE %d (need about %d)", lim.Cur, need)
}

// runLoad drives p with l and measures it.
func runLoad(ctx context.Context, t *testing.T, p *process, model *fakeModel, l load, tag string) *result {
	c := newClient(model.epoch, replyWords, l.streams)
	defer c.close()
	r := &result{server: p.name, load: l, errors: map[string]int{}, loadavg: loadAverage()}
	threads := make([]string, l.streams)
	histories := make([][]uiMessage, l.streams)
	for i := range threads {
		threads[i] = fmt.Sprintf("pb-%s-%d", tag, i)
	}
	// Warm up: two streams, not measured (V8 compiles the route's code on its first requests, Go has its pools).
	var warm sync.WaitGroup
	for i := range 2 {
		warm.Add(1)
		go func() {
			defer warm.Done()
			th := fmt.Sprintf("pb-%s-warm-%d", tag, i)
			tr := c.send(ctx, p.url, p.token, th, []uiMessage{{ID: th + "-u", Role: "user", Parts: []uiPart{{Type: "text", Text: "warm up"}}}})
			if tr.err != "" {
				t.Errorf("%s: warm-up stream: %s", p.name, tr.err)
			}
		}()
	}
	warm.Wait()
	var mu sync.Mutex
	calls0 := model.requests.Load()
	model.lag()
	cpu0, err := p.cpu()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for round := range l.rounds {
		release := make(chan struct{})
		var wg sync.WaitGroup
		for i := range l.streams {
			histories[i] = append(histories[i], uiMessage{ID: fmt.Sprintf("%s-u%d", threads[i], round), Role: "user",
				Parts: []uiPart{{Type: "text", Text: fmt.Sprintf("peer benchmark, round %d: say 200 words", round+1)}}})
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-release
				tctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
				defer cancel()
				tr := c.send(tctx, p.url, p.token, threads[i], histories[i])
				histories[i] = append(histories[i], tr.reply)
				mu.Lock()
				defer mu.Unlock()
				r.streams++
				r.words += int64(tr.words)
				r.lat = append(r.lat, tr.lat...)
				if tr.words > 0 {
					r.first = append(r.first, tr.first)
				}
				if tr.err != "" {
					r.failed++
					r.errors[tr.err]++
				}
			}()
		}
		close(release)
		wg.Wait()
	}
	r.wall = time.Since(start)
	cpu1, err := p.cpu()
	if err != nil {
		t.Fatal(err)
	}
	r.cpu = cpu1 - cpu0
	r.modelCalls = model.requests.Load() - calls0
	r.lateWrites, r.maxLag = model.lag()
	if r.peakRSS, err = p.peakRSS(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(r.lat)
	slices.Sort(r.first)
	if p.name == "agentloop" {
		o, err := c.storedOutcomes(ctx, p.url, p.token, threads)
		r.stored, r.storedErr = &o, err
	}
	return r
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ms(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

func mb(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/(1<<20)) }

func errorsCell(r *result) string {
	if r.failed == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.errors)) {
		parts = append(parts, fmt.Sprintf("%d %s", r.errors[k], k))
	}
	return strings.Join(parts, "; ")
}

func storedCell(r *result) string {
	if r.stored == nil {
		return "— (stores nothing)"
	}
	o := r.stored
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(o.byStatus)) {
		parts = append(parts, fmt.Sprintf("%d %s", o.byStatus[k], k))
	}
	s := fmt.Sprintf("%d runs: %s", o.runs, strings.Join(parts, ", "))
	if o.runs != r.streams {
		s += fmt.Sprintf(" (%d streams sent)", r.streams)
	}
	if r.storedErr != nil {
		s += " (reading them: " + r.storedErr.Error() + ")"
	}
	return s
}

func statementsCell(r *result) string {
	if r.stored == nil {
		return "—"
	}
	o := r.stored
	s := fmt.Sprintf("runs %.0f/s (%.1f per run-second)", float64(o.statements)/r.wall.Seconds(), float64(o.statements)/o.runSeconds)
	if r.procStatements >= 0 {
		s += fmt.Sprintf(", process %.0f/s", float64(r.procStatements)/r.wall.Seconds())
	}
	if o.unmeasured > 0 {
		s += fmt.Sprintf(", %d runs unmeasured", o.unmeasured)
	}
	return s
}

// printTables prints the per-server table and the side-by-side one (the shape) on stdout.
func printTables(results []*result, loads []load) {
	fmt.Printf("\nPeer benchmark: %d words every %s per reply; CPU = the server process's user+sys; latency = fake model send → client receipt, per word\n\n",
		replyWords, wordEvery)
	fmt.Println("| load | server | streams (failed) | words | CPU per word | p50 | p99 | POST → first word p50, p99 | peak RSS | wall | load avg at start | fake model behind schedule | errors | stored runs | store statements per streaming second |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		fmt.Printf("| %s | %s | %d (%d) | %d | %s | %s | %s | %s, %s | %s | %s | %s | %d writes > %s late, max %s | %s | %s | %s |\n", r.load, r.server, r.streams, r.failed,
			r.words, us(r.cpuPerWord()), ms(r.pct(0.50)), ms(r.pct(0.99)), ms(r.firstPct(0.5)), ms(r.firstPct(0.99)), mb(r.peakRSS), ms(r.wall), r.loadavg,
			r.lateWrites, ms(lagLimit), ms(r.maxLag), errorsCell(r),
			storedCell(r), statementsCell(r))
	}
	fmt.Println()
	fmt.Println("| load | agentloop CPU per word | AI SDK | ratio | p50 agentloop vs AI SDK | p99 | POST → first word p99 | peak RSS | errors | agentloop stored runs |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, l := range loads {
		var a, b *result
		for _, r := range results {
			if r.load == l && r.server == "agentloop" {
				a = r
			}
			if r.load == l && r.server == "aisdk" {
				b = r
			}
		}
		if a == nil || b == nil {
			continue
		}
		ratio := "—"
		if b.cpuPerWord() > 0 {
			ratio = fmt.Sprintf("%.2f", float64(a.cpuPerWord())/float64(b.cpuPerWord()))
		}
		fmt.Printf("| %s | %s | %s | %s | %s vs %s | %s vs %s | %s vs %s | %s vs %s | %d vs %d | %s |\n", l, us(a.cpuPerWord()), us(b.cpuPerWord()), ratio,
			ms(a.pct(0.5)), ms(b.pct(0.5)), ms(a.pct(0.99)), ms(b.pct(0.99)), ms(a.firstPct(0.99)), ms(b.firstPct(0.99)),
			mb(a.peakRSS), mb(b.peakRSS), a.failed, b.failed, storedCell(a))
	}
	fmt.Println()
}
