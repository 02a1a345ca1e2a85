package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

const jobCols = `thread_id, id, owner, kind, tool_call_id, input, status, activity, result, error, steer_delivered,
	execution, due_at, created_at, updated_at, finished_at, usage`

func scanJob(sc scanner) (agent.Job, error) {
	var (
		j                agent.Job
		input, result    sql.NullString
		usage            sql.NullString
		status           string
		due, finished    sql.NullInt64
		created, updated int64
	)
	err := sc.Scan(&j.ThreadID, &j.ID, &j.Owner, &j.Kind, &j.ToolCallID, &input, &status, &j.Activity, &result,
		&j.Error, &j.SteerDelivered, &j.Execution, &due, &created, &updated, &finished, &usage)
	if err != nil {
		return agent.Job{}, err
	}
	if usage.Valid {
		_ = json.Unmarshal([]byte(usage.String), &j.Usage) // an account, not the job's truth: unreadable is zero
	}
	j.Status = agent.JobStatus(status)
	if input.Valid {
		j.Input = json.RawMessage(input.String)
	}
	if result.Valid {
		j.Result = json.RawMessage(result.String)
	}
	j.DueAt, j.FinishedAt = fromNullMillis(due), fromNullMillis(finished)
	j.CreatedAt, j.UpdatedAt = fromMillis(created), fromMillis(updated)
	return j, nil
}

func jobNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeJobNotFound, "job %s of thread %q not found", id, threadID)
}

// getJobIn reads one job inside a transaction; unknown is jobNotFound.
func getJobIn(ctx context.Context, c conn, threadID, id string) (agent.Job, error) {
	j, err := scanJob(c.queryRow(ctx, `SELECT `+jobCols+` FROM jobs WHERE thread_id = ? AND id = ?`, threadID, id))
	if errors.Is(err, sql.ErrNoRows) {
		return agent.Job{}, jobNotFound(threadID, id)
	}
	return j, err
}

// CreateJob inserts j unless (thread, id) exists, in one transaction that first checks the thread row (as
// CreateInterrupt does): a job never outlives its thread.
func (s *Store) CreateJob(ctx context.Context, j agent.Job) (agent.Job, bool, error) {
	s.op()
	if err := j.Check(); err != nil {
		return agent.Job{}, false, err
	}
	var (
		stored  agent.Job
		created bool
	)
	err := s.write(ctx, "create job", func(c conn) error {
		if err := threadExists(ctx, c, j.ThreadID); err != nil {
			return err
		}
		if err := recreatedClaimAllows(ctx, c, j.ThreadID, j.Writer); err != nil {
			return err
		}
		n, err := c.execN(ctx, `INSERT INTO jobs (`+jobCols+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL, '', 0, ?, ?, ?, ?, NULL, NULL) ON CONFLICT (thread_id, id) DO NOTHING`,
			j.ThreadID, j.ID, j.Owner, j.Kind, j.ToolCallID, rawJSON(j.Input), string(j.Status), j.Activity,
			j.Execution, millis(j.DueAt), millis(j.CreatedAt), millis(j.UpdatedAt))
		if err != nil {
			return err
		}
		created = n == 1
		stored, err = getJobIn(ctx, c, j.ThreadID, j.ID)
		return err
	})
	if err != nil {
		return agent.Job{}, false, err
	}
	return stored, created, nil
}

// threadExists is the check every child's insert makes in its transaction: no row, not found.
func threadExists(ctx context.Context, c conn, id string) error {
	var one int
	err := c.queryRow(ctx, `SELECT 1 FROM threads WHERE id = ?`, id).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return threadNotFound(id)
	}
	return err
}

// GetJob reads one job; unknown is KindNotFound/CodeJobNotFound.
func (s *Store) GetJob(ctx context.Context, threadID, id string) (agent.Job, error) {
	s.op()
	j, err := getJobIn(ctx, s.read(), threadID, id)
	if err != nil {
		return agent.Job{}, s.fail("get job", err)
	}
	return j, nil
}

// ListJobs returns the thread's jobs oldest first, ties by id (jobs_by_created).
func (s *Store) ListJobs(ctx context.Context, threadID string) ([]agent.Job, error) {
	s.op()
	rows, err := s.read().query(ctx, `SELECT `+jobCols+` FROM jobs WHERE thread_id = ? ORDER BY created_at, id`, threadID)
	if err != nil {
		return nil, s.fail("list jobs", err)
	}
	out, err := collect(rows, scanJob)
	if err != nil {
		return nil, s.fail("list jobs", err)
	}
	return out, nil
}

// ListJobsPage reads the thread's undelivered jobs through the partial index jobs_due (every undelivered job of
// the file, few: a user's active jobs are leased; only this thread's rows are read) and its newest `finished`
// delivered ones walking jobs_by_created backwards (it stops at the limit, skipping the few undelivered ones it
// meets), in one statement; Omitted comes from a count of the thread's jobs that reads jobs_by_created only, never
// a row (REVIEW S7).
func (s *Store) ListJobsPage(ctx context.Context, threadID string, finished int) (agent.JobsPage, error) {
	s.op()
	finished = max(finished, 0)
	rows, err := s.read().query(ctx, `SELECT `+jobCols+` FROM (
			SELECT * FROM jobs INDEXED BY jobs_due WHERE steer_delivered = 0 AND thread_id = ?
			UNION ALL
			SELECT * FROM (SELECT * FROM jobs INDEXED BY jobs_by_created WHERE thread_id = ? AND steer_delivered = 1
				ORDER BY created_at DESC, id DESC LIMIT ?))
		ORDER BY created_at, id`, threadID, threadID, finished)
	if err != nil {
		return agent.JobsPage{}, s.fail("list jobs page", err)
	}
	out, err := collect(rows, scanJob)
	if err != nil {
		return agent.JobsPage{}, s.fail("list jobs page", err)
	}
	var total int
	if err := s.read().queryRow(ctx, `SELECT COUNT(*) FROM jobs INDEXED BY jobs_by_created WHERE thread_id = ?`, threadID).Scan(&total); err != nil {
		return agent.JobsPage{}, s.fail("count jobs", err)
	}
	return agent.JobsPage{Jobs: out, Omitted: max(total-len(out), 0)}, nil
}

// SetJobActivity is one UPDATE conditioned on finished_at IS NULL; when it matches nothing, a read in the same
// transaction tells an unknown job from a finished one.
func (s *Store) SetJobActivity(ctx context.Context, threadID, id, activity string, now time.Time) error {
	s.op()
	return s.write(ctx, "set job activity", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE jobs SET activity = ?, updated_at = ?
			WHERE thread_id = ? AND id = ? AND finished_at IS NULL`, activity, millis(now), threadID, id)
		if err != nil || n == 1 {
			return err
		}
		if _, err := getJobIn(ctx, c, threadID, id); err != nil {
			return err
		}
		return agent.E(agent.KindConflict, agent.CodeJobFinished, "job %s has finished: its activity is final", id)
	})
}

// usageJSON is a job's usage as stored: NULL when zero.
func usageJSON(u agent.Usage) any {
	if u == (agent.Usage{}) {
		return nil
	}
	b, _ := json.Marshal(u)
	return string(b)
}

// SetJobDue is one UPDATE conditioned on finished_at IS NULL (jobs_due follows due_at); when it matches nothing,
// a read in the same transaction tells an unknown job from a finished one.
func (s *Store) SetJobDue(ctx context.Context, threadID, id string, due, now time.Time) error {
	s.op()
	return s.write(ctx, "set job due", func(c conn) error {
		n, err := c.execN(ctx, `UPDATE jobs SET due_at = ?, updated_at = ?
			WHERE thread_id = ? AND id = ? AND finished_at IS NULL`, millis(due), millis(now), threadID, id)
		if err != nil || n == 1 {
			return err
		}
		if _, err := getJobIn(ctx, c, threadID, id); err != nil {
			return err
		}
		return agent.E(agent.KindConflict, agent.CodeJobFinished, "job %s has finished: its deadline is its delivery's", id)
	})
}

// finishJobSQL is the compare-and-set on "not finished"; it returns the row it wrote.
const finishJobSQL = `UPDATE jobs SET result = ?, error = ?, finished_at = ?, updated_at = ?, due_at = ?, usage = ?
	WHERE thread_id = ? AND id = ? AND finished_at IS NULL RETURNING ` + jobCols

// FinishJob is one transaction: the compare-and-set UPDATE, and when it matched nothing, the read that returns
// the stored (finished) job or tells an unknown one.
func (s *Store) FinishJob(ctx context.Context, r agent.JobResult) (agent.Job, bool, error) {
	s.op()
	if err := r.Check(); err != nil {
		return agent.Job{}, false, err
	}
	var (
		stored agent.Job
		won    bool
	)
	err := s.write(ctx, "finish job", func(c conn) error {
		var err error
		stored, err = scanJob(c.queryRow(ctx, finishJobSQL, rawJSON(r.Result), r.Error, millis(r.Now), millis(r.Now),
			millis(r.DueAt), usageJSON(r.Usage), r.ThreadID, r.ID))
		if err == nil {
			won = true
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		stored, err = getJobIn(ctx, c, r.ThreadID, r.ID)
		return err
	})
	if err != nil {
		return agent.Job{}, false, err
	}
	return stored, won, nil
}

// deliverSQL records the delivery of a finished, undelivered job; it returns the row it wrote.
const deliverSQL = `UPDATE jobs SET steer_delivered = 1, due_at = NULL, updated_at = ?,
		status = CASE WHEN error <> '' THEN 'error' ELSE 'done' END
	WHERE thread_id = ? AND id = ? AND finished_at IS NOT NULL AND steer_delivered = 0 RETURNING ` + jobCols

// MarkJobDelivered is one transaction: the UPDATE (which takes the row out of jobs_due), and when it matched
// nothing, the read that returns a delivered job unchanged or tells an unknown or unfinished one.
func (s *Store) MarkJobDelivered(ctx context.Context, threadID, id string, now time.Time) (agent.Job, error) {
	s.op()
	var stored agent.Job
	err := s.write(ctx, "mark job delivered", func(c conn) error {
		var err error
		stored, err = scanJob(c.queryRow(ctx, deliverSQL, millis(now), threadID, id))
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if stored, err = getJobIn(ctx, c, threadID, id); err != nil {
			return err
		}
		if !stored.Finished() {
			return agent.E(agent.KindConflict, agent.CodeJobNotFinished, "job %s has not finished: nothing to deliver", id)
		}
		return nil // delivered already
	})
	if err != nil {
		return agent.Job{}, err
	}
	return stored, nil
}

// listDueSQL reads the partial index of undelivered jobs (INDEXED BY: the statement fails to prepare rather than
// fall back to a scan if the index ever stops matching the query).
const listDueSQL = `SELECT ` + jobCols + ` FROM jobs INDEXED BY jobs_due
	WHERE steer_delivered = 0 AND due_at < ? ORDER BY due_at, thread_id, id LIMIT ?`

// ListDueJobs returns undelivered jobs past their deadline, earliest first (ties by thread and id), from the
// jobs_due index. The answer is exact at the time of the read.
func (s *Store) ListDueJobs(ctx context.Context, before time.Time, limit int) ([]agent.Job, error) {
	return listBefore(ctx, s, "list due jobs", listDueSQL, scanJob, before, limit)
}
