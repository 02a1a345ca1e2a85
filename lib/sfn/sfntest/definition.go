package sfntest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/agentloop/agentloop/internal/testenv"
	"github.com/agentloop/agentloop/lib/agent"
)

// The job state machine's task states, by the names infra/jobs.asl.json gives them.
const (
	StateRunSubagent = "RunSubagent"
	StateDeliver     = "Deliver"
)

// backoffRate is the one BackoffRate the contract knows: each retry waits twice the one before.
const backoffRate = 2

// DefinitionFile is the job state machine's path under the module root.
const DefinitionFile = "infra/jobs.asl.json"

// DefinitionPath is the job state machine's absolute path.
func DefinitionPath() (string, error) {
	root, err := testenv.Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, DefinitionFile), nil
}

// ReadDefinition reads the job state machine.
func ReadDefinition() ([]byte, error) {
	path, err := DefinitionPath()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

var placeholder = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)\}`)

// Substitute fills the ${NAME} placeholders of def as SAM's DefinitionSubstitutions does; a placeholder without a
// value is an error.
func Substitute(def []byte, subs map[string]string) ([]byte, error) {
	var missing []string
	out := placeholder.ReplaceAllFunc(def, func(m []byte) []byte {
		name := string(placeholder.FindSubmatch(m)[1])
		v, ok := subs[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		return []byte(v)
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("sfntest: no substitution for %v", missing)
	}
	return out, nil
}

// Contract reads the job contract a definition states: the sub-agent task's TimeoutSeconds (TaskTimeout), its
// contract retrier's MaxAttempts (TaskRetries) and IntervalSeconds (RetryInterval), the delivery task's
// contract retrier's MaxAttempts (DeliverRetries) and IntervalSeconds (RetryInterval again), and the top-level
// TimeoutSeconds (ExecutionTimeout). A task's contract retrier is the one that names TransientError (its other
// retriers, such as throttling's, are Lambda's business, which the local runner never meets). DeliveryGrace is
// no part of the state machine: it comes back zero. The contract has one number of each kind, so a definition
// whose contract retriers disagree, or that states a BackoffRate other than 2, is an error rather than a contract.
func Contract(def []byte) (agent.JobContract, error) {
	m, err := decode(def)
	if err != nil {
		return agent.JobContract{}, err
	}
	var c agent.JobContract
	if c.ExecutionTimeout, err = seconds(m, "TimeoutSeconds"); err != nil {
		return c, err
	}
	sub, err := state(m, StateRunSubagent)
	if err != nil {
		return c, err
	}
	if c.TaskTimeout, err = seconds(sub, "TimeoutSeconds"); err != nil {
		return c, fmt.Errorf("%s: %w", StateRunSubagent, err)
	}
	var subInterval, delInterval time.Duration
	if c.TaskRetries, subInterval, err = retriers(sub); err != nil {
		return c, fmt.Errorf("%s: %w", StateRunSubagent, err)
	}
	del, err := state(m, StateDeliver)
	if err != nil {
		return c, err
	}
	if c.DeliverRetries, delInterval, err = retriers(del); err != nil {
		return c, fmt.Errorf("%s: %w", StateDeliver, err)
	}
	if subInterval != delInterval {
		return c, fmt.Errorf("sfntest: retry intervals differ: %s %v, %s %v", StateRunSubagent, subInterval, StateDeliver, delInterval)
	}
	c.RetryInterval = subInterval
	return c, nil
}

// WithContract returns def with c's numbers in the places Contract reads them from, and every other retrier's
// IntervalSeconds scaled as RetryInterval is from agent.DefaultJobContract's, everything else as it was
// (re-encoded: key order and spacing change, nothing else). TaskTimeout and ExecutionTimeout must be whole
// seconds (TimeoutSeconds is an integer); RetryInterval may be a fraction of a second, which aws-local-stepfunctions
// honours and AWS refuses: a scaled copy is for the local interpreter only.
func WithContract(def []byte, c agent.JobContract) ([]byte, error) {
	m, err := decode(def)
	if err != nil {
		return nil, err
	}
	whole := func(d time.Duration, what string) (json.Number, error) {
		if d < time.Second || d%time.Second != 0 {
			return "", fmt.Errorf("sfntest: %s %v is not a whole number of seconds", what, d)
		}
		return json.Number(strconv.FormatInt(int64(d/time.Second), 10)), nil
	}
	if m["TimeoutSeconds"], err = whole(c.ExecutionTimeout, "ExecutionTimeout"); err != nil {
		return nil, err
	}
	interval := json.Number(strconv.FormatFloat(c.RetryInterval.Seconds(), 'f', -1, 64))
	for _, s := range []struct {
		name     string
		attempts int
	}{{StateRunSubagent, c.TaskRetries}, {StateDeliver, c.DeliverRetries}} {
		st, err := state(m, s.name)
		if err != nil {
			return nil, err
		}
		if s.name == StateRunSubagent {
			if st["TimeoutSeconds"], err = whole(c.TaskTimeout, "TaskTimeout"); err != nil {
				return nil, err
			}
		}
		list, _ := st["Retry"].([]any)
		if len(list) == 0 {
			return nil, fmt.Errorf("sfntest: %s has no Retry", s.name)
		}
		scale := c.RetryInterval.Seconds() / agent.DefaultJobContract().RetryInterval.Seconds()
		for _, r := range list {
			r := r.(map[string]any)
			if !contractRetrier(r) {
				if iv, err := number(r, "IntervalSeconds"); err == nil {
					r["IntervalSeconds"] = json.Number(strconv.FormatFloat(iv*scale, 'f', -1, 64))
				}
				continue
			}
			r["MaxAttempts"] = json.Number(strconv.Itoa(s.attempts))
			r["IntervalSeconds"] = interval
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func decode(def []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(def))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("sfntest: definition: %w", err)
	}
	return m, nil
}

func state(m map[string]any, name string) (map[string]any, error) {
	states, _ := m["States"].(map[string]any)
	s, ok := states[name].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("sfntest: definition has no state %s", name)
	}
	return s, nil
}

func number(m map[string]any, key string) (float64, error) {
	n, ok := m[key].(json.Number)
	if !ok {
		return 0, fmt.Errorf("sfntest: no number %s", key)
	}
	return n.Float64()
}

func seconds(m map[string]any, key string) (time.Duration, error) {
	f, err := number(m, key)
	if err != nil {
		return 0, err
	}
	return time.Duration(math.Round(f * float64(time.Second))), nil
}

// TransientErrorName is how a task's error *agent.TransientError is named in ErrorEquals (ErrorType).
const TransientErrorName = "TransientError"

// contractRetrier reports whether a retrier names TransientError: the retrier the contract states.
func contractRetrier(r map[string]any) bool {
	names, _ := r["ErrorEquals"].([]any)
	for _, n := range names {
		if n == TransientErrorName {
			return true
		}
	}
	return false
}

// retriers reads the MaxAttempts and IntervalSeconds of a task's contract retrier (there must be one).
func retriers(s map[string]any) (attempts int, interval time.Duration, err error) {
	list, _ := s["Retry"].([]any)
	var mine []any
	for _, r := range list {
		if r, ok := r.(map[string]any); ok && contractRetrier(r) {
			mine = append(mine, r)
		}
	}
	if len(mine) == 0 {
		return 0, 0, fmt.Errorf("sfntest: no Retry names %s", TransientErrorName)
	}
	for i, r := range mine {
		r, _ := r.(map[string]any)
		a, err := number(r, "MaxAttempts")
		if err != nil {
			return 0, 0, err
		}
		iv, err := seconds(r, "IntervalSeconds")
		if err != nil {
			return 0, 0, err
		}
		if b, err := number(r, "BackoffRate"); err != nil || b != backoffRate {
			return 0, 0, fmt.Errorf("sfntest: retrier %d: BackoffRate %v, want %d", i, r["BackoffRate"], backoffRate)
		}
		if i > 0 && (int(a) != attempts || iv != interval) {
			return 0, 0, fmt.Errorf("sfntest: retriers disagree: %d attempts every %v, then %v every %v", attempts, interval, a, iv)
		}
		attempts, interval = int(a), iv
	}
	return attempts, interval, nil
}
