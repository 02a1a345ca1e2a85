package chaos

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
)

// result is one mode's numbers and findings.
type result struct {
	mode     string
	tally    *tally
	kills    int
	restart  time.Duration // the longest restart (kill to banner)
	settle   time.Duration
	runs     int
	final    *finalCounts
	findings []string
}

func TestChaosSoak(t *testing.T) {
	durText := os.Getenv("CHAOS_DURATION")
	if durText == "" {
		t.Skip("the chaos soak runs with CHAOS_DURATION set (make soak-chaos)")
	}
	dur, err := time.ParseDuration(durText)
	if err != nil || dur <= 0 {
		t.Fatalf("CHAOS_DURATION=%q: want a duration such as 60s", durText)
	}
	clients := 12
	if v := os.Getenv("CHAOS_CLIENTS"); v != "" {
		if clients, err = strconv.Atoi(v); err != nil || clients < 1 {
			t.Fatalf("CHAOS_CLIENTS=%q: want a positive integer", v)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED=%q: want an unsigned integer", v)
		}
	}
	kills := os.Getenv("CHAOS_KILLS") != "off"
	modes := strings.Split(cmp.Or(os.Getenv("CHAOS_MODES"), "default,off"), ",")
	for _, m := range modes {
		if m != "default" && m != "off" {
			t.Fatalf("CHAOS_MODES=%q: want default, off or both", os.Getenv("CHAOS_MODES"))
		}
	}

	work, err := os.MkdirTemp("", "agentloop-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	bin := os.Getenv("CHAOS_BIN")
	if bin == "" {
		if bin, err = testenv.BuildAgentloop(work); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Printf("chaos soak: seed %d, %d clients of one user, SIGKILL every 2–6 s, %s per mode; logs in %s\n", seed, clients, dur, work)
	var results []result
	for _, mode := range modes {
		results = append(results, soak(t, bin, work, mode, dur, clients, seed, kills))
	}
	printTable(results, clients, dur, seed, kills)
	failed := false
	for _, r := range results {
		for _, f := range r.findings {
			t.Errorf("%s: %s", r.mode, f)
			failed = true
		}
	}
	if failed {
		t.Logf("the servers' logs are kept in %s", work)
		return
	}
	_ = os.RemoveAll(work)
}

// soak runs one mode: a fresh data directory, the clients and the killer for dur, then the check.
func soak(t *testing.T, bin, work, mode string, dur time.Duration, clients int, seed uint64, kills bool) result {
	res := result{mode: mode, tally: newTally()}
	data := filepath.Join(work, mode, "data")
	log, err := os.Create(filepath.Join(work, mode+".log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	srv := newDevServer(bin, data, "127.0.0.1:"+strconv.Itoa(port), mode == "off", log)
	bg := context.Background()
	if err := srv.start(bg); err != nil {
		t.Fatal(err)
	}
	defer srv.kill()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients, IdleConnTimeout: 30 * time.Second}}
	a := api{base: srv.url(), token: srv.token, http: hc}

	ctx, cancel := context.WithTimeout(bg, dur)
	defer cancel()
	cs := make([]*client, clients)
	var wg sync.WaitGroup
	for i := range cs {
		cs[i] = &client{base: srv.url, token: srv.token, thread: fmt.Sprintf("chaos-%s-c%02d", mode, i+1),
			rng: rand.New(rand.NewPCG(seed, uint64(i+1))), http: hc, tally: res.tally}
		wg.Go(func() { cs[i].run(ctx) })
	}
	// The killer: SIGKILL after 2–6 s, start again on the same port and file, until the duration ends (so the
	// last process is left running).
	killer := rand.New(rand.NewPCG(seed, 0))
	var startErr error
	for startErr == nil {
		wait := 2*time.Second + time.Duration(killer.Int64N(int64(4*time.Second)))
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		if ctx.Err() != nil {
			break
		}
		if !kills {
			continue
		}
		began := time.Now()
		srv.kill()
		res.kills++
		startErr = srv.start(bg)
		res.restart = max(res.restart, time.Since(began))
	}
	if startErr != nil {
		cancel()
		wg.Wait()
		t.Fatalf("%s: restart %d: %v", mode, res.kills, startErr)
	}
	wg.Wait()

	threads := make([]string, len(cs))
	for i, c := range cs {
		threads[i] = c.thread
	}
	// The dead runs end once their heartbeat is AGENT_STALE_AFTER old and a reaper pass (or a read) finds them.
	stale := agent.DefaultStaleAfter
	if v, err := time.ParseDuration(os.Getenv("AGENT_STALE_AFTER")); err == nil && v > 0 {
		stale = v
	}
	res.settle, _ = a.settle(bg, threads, 2*stale+reaper.DefaultInterval+30*time.Second)
	for _, c := range cs {
		f, runs := a.checkThread(bg, c)
		res.findings = append(res.findings, f...)
		res.runs += runs
	}
	res.final = a.finals(bg, cs, newTally())
	res.findings = append(res.findings, res.final.findings...)
	return res
}

func newTally() *tally {
	return &tally{failed: map[string]int{}, refused: map[string]int{}, resumed: map[string]int{}}
}

// printTable prints the modes side by side.
func printTable(results []result, clients int, dur time.Duration, seed uint64, kills bool) {
	type row struct {
		name string
		val  func(r result) string
	}
	itoa := strconv.Itoa
	rows := []row{
		{"kills (SIGKILL, restart on the same file)", func(r result) string { return itoa(r.kills) }},
		{"longest restart (kill to banner)", func(r result) string { return r.restart.Round(time.Millisecond).String() }},
		{"POST /chat requests", func(r result) string { return itoa(r.tally.posts) }},
		{"messages tried", func(r result) string { return itoa(r.tally.attempted) }},
		{"messages sent (accepted: 200)", func(r result) string { return itoa(r.tally.accepted) }},
		{"replies completed", func(r result) string { return itoa(r.tally.completed) }},
		{"replies cut by a kill", func(r result) string { return itoa(r.tally.cut) }},
	}
	// keys are the sorted keys of one of every result's maps.
	keys := func(m func(r result) map[string]int) []string {
		set := map[string]bool{}
		for _, r := range results {
			for k := range m(r) {
				set[k] = true
			}
		}
		return slices.Sorted(maps.Keys(set))
	}
	for _, k := range keys(func(r result) map[string]int { return r.tally.failed }) {
		rows = append(rows, row{"replies failed: " + k, func(r result) string { return itoa(r.tally.failed[k]) }})
	}
	for _, k := range keys(func(r result) map[string]int { return r.tally.refused }) {
		rows = append(rows, row{"refused " + k, func(r result) string { return itoa(r.tally.refused[k]) }})
	}
	for _, k := range keys(func(r result) map[string]int { return r.tally.resumed }) {
		rows = append(rows, row{"resume after a cut: " + k, func(r result) string { return itoa(r.tally.resumed[k]) }})
	}
	rows = append(rows,
		row{"no answer (server down or killed)", func(r result) string { return itoa(r.tally.connErr) }},
		row{"runs stored", func(r result) string { return itoa(r.runs) }},
		row{"settle after the last kill", func(r result) string { return r.settle.Round(100 * time.Millisecond).String() }},
		row{"final messages answered (one per thread)", func(r result) string { return fmt.Sprintf("%d/%d", r.final.answered, clients) }},
		row{fmt.Sprintf("final: 429 too_many_runs (%d at once)", finalWave), func(r result) string { return itoa(r.final.runs429) }},
		row{fmt.Sprintf("final: readers attached (%d per run)", finalReaders), func(r result) string { return itoa(r.final.readers) }},
		row{"final: 429 too_many_streams", func(r result) string { return itoa(r.final.reads429) }},
		row{"findings (lost, duplicated, stuck)", func(r result) string { return itoa(len(r.findings)) }},
	)
	names := map[string]string{"default": "default limits", "off": "limits off"}
	width := 0
	for _, r := range rows {
		width = max(width, len([]rune(r.name)))
	}
	var b strings.Builder
	killing := "SIGKILL every 2–6 s"
	if !kills {
		killing = "no kills (CHAOS_KILLS=off)"
	}
	fmt.Fprintf(&b, "\nchaos soak, seed %d: %d clients of one user, %s, %s per mode\n", seed, clients, killing, dur)
	fmt.Fprintf(&b, "%-*s", width+2, "")
	for _, r := range results {
		fmt.Fprintf(&b, "%16s", names[r.mode])
	}
	b.WriteString("\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "%s%s", row.name, strings.Repeat(" ", width+2-len([]rune(row.name))))
		for _, r := range results {
			fmt.Fprintf(&b, "%16s", row.val(r))
		}
		b.WriteString("\n")
	}
	fmt.Print(b.String())
}
