package dynamo

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// Job item attributes, besides the shared id, threadId, toolCallId, status, createdAt, updatedAt, finishedAt,
// createId and the index keys dueShard/dueAt (the job's DueAt, present until delivery). The input is the head's
// first large value (body…), the result its second (respBody…).
const (
	attrChildOwner     = "ownedBy" // "owner" is the byOwner index's key: a child must not look like a thread
	attrJobKind        = "jobKind" // "kind" is every item's type tag
	attrActivity       = "activity"
	attrJobError       = "jobError"
	attrExecution      = "execution"
	attrSteerDelivered = "steerDelivered" // true once delivered; absent before
	// attrOutcome is the status the job takes on delivery ("done" or "error"), written by the finish, so the
	// delivery is one update that copies it (SET status = outcome) without reading the job first.
	attrOutcome = "outcome"
	// attrFinishID names the call that stored the result (a fresh id per call), as resolveId does for interrupts.
	attrFinishID = "finishId"
	// attrJobUsage is the sub-agent's usage (agent.Usage as JSON), set by the finish when not zero.
	attrJobUsage = "jobUsage"
)

// maxJobTextBytes bounds a job's free-form texts (the activity line, a failure's text): longer ones are cut (at a
// rune boundary), as a run's error message is, so that a chatty sub-agent can always report, and the head stays
// far under the item limit.
const maxJobTextBytes = 16 * 1024

func jobItem(j agent.Job) item {
	it := key(threadPK(j.ThreadID), jobSK(j.ID))
	it[attrKind] = avS("job")
	it[attrID] = avS(j.ID)
	it[attrThreadID] = avS(j.ThreadID)
	it[attrJobKind] = avS(j.Kind)
	it[attrToolCallID] = avS(j.ToolCallID)
	it[attrStatus] = avS(string(j.Status))
	it[attrCreatedAt] = avT(j.CreatedAt)
	it[attrUpdatedAt] = avT(j.UpdatedAt)
	if j.Writer.Epoch != 0 {
		it[attrEpoch] = avN(j.Writer.Epoch) // the incarnation it belongs to (incarnation.go)
	}
	for a, v := range map[string]string{attrChildOwner: j.Owner, attrExecution: j.Execution,
		attrActivity: truncateUTF8(j.Activity, maxJobTextBytes)} {
		if v != "" {
			it[a] = avS(v)
		}
	}
	// Created undelivered (Job.Check): the job enters the dueWork index, and the threadJobs index as running.
	it[AttrDueShard] = avS(jobShard(j.ThreadID))
	it[AttrDueAt] = avT(j.DueAt)
	it[AttrJobThread] = avS(jobRunningOrder + threadPK(j.ThreadID))
	it[AttrJobOrder] = avS(fmtTime(j.CreatedAt) + "#" + j.ID)
	return it
}

// The threadJobs index's attributes (REVIEW S7): a thread's view reads its running jobs and its newest delivered
// ones from it, instead of every job the thread ever ran.
const (
	// AttrJobThread is the job's state, then its thread's pk: jobRunningOrder while undelivered, jobDeliveredOrder
	// once MarkJobDelivered set it done or error (that write knows the pk, so it needs no read first).
	AttrJobThread = "jobThread"
	// AttrJobOrder is "<createdAt>#<id>" (fixed-width times sort as strings).
	AttrJobOrder = "jobOrder"

	jobRunningOrder   = "R#"
	jobDeliveredOrder = "F#"
)

// decodeJobFields reads everything but the two values.
func decodeJobFields(it item) agent.Job {
	return agent.Job{
		ID:             getS(it, attrID),
		ThreadID:       getS(it, attrThreadID),
		Owner:          getS(it, attrChildOwner),
		Kind:           getS(it, attrJobKind),
		ToolCallID:     getS(it, attrToolCallID),
		Status:         agent.JobStatus(getS(it, attrStatus)),
		Activity:       getS(it, attrActivity),
		Error:          getS(it, attrJobError),
		SteerDelivered: getBool(it, attrSteerDelivered),
		Execution:      getS(it, attrExecution),
		DueAt:          getT(it, AttrDueAt),
		CreatedAt:      getT(it, attrCreatedAt),
		UpdatedAt:      getT(it, attrUpdatedAt),
		FinishedAt:     getT(it, attrFinishedAt),
		Usage:          jobUsage(it),
	}
}

// jobUsage reads a job's usage (zero when absent or unreadable: usage is an account, not the job's truth).
func jobUsage(it item) agent.Usage {
	var u agent.Usage
	if raw := getS(it, attrJobUsage); raw != "" {
		_ = json.Unmarshal([]byte(raw), &u)
	}
	return u
}

func (s *Store) decodeJob(ctx context.Context, head item, chunks map[string]item) (agent.Job, error) {
	j := decodeJobFields(head)
	err := s.unpackValues(ctx, head, jobChunkSK(j.ID), chunks, valueSlot{inputBlob, &j.Input}, valueSlot{responseBlob, &j.Result})
	return j, err
}

// loadJobs decodes job heads with one batched read of all their chunks.
func (s *Store) loadJobs(ctx context.Context, heads []item) ([]agent.Job, error) {
	return loadHeads(ctx, s, headKind[agent.Job]{
		values:  []blobNames{inputBlob, responseBlob},
		chunkSK: func(h item) chunkKeyFunc { return jobChunkSK(getS(h, attrID)) },
		decode:  s.decodeJob,
	}, heads)
}

// loadJob decodes one head; a head gone meanwhile is not found.
func (s *Store) loadJob(ctx context.Context, head item, threadID, id string) (agent.Job, error) {
	got, err := s.loadJobs(ctx, []item{head})
	if err != nil {
		return agent.Job{}, err
	}
	if len(got) == 0 {
		return agent.Job{}, jobNotFound(threadID, id)
	}
	return got[0], nil
}

func jobNotFound(threadID, id string) error {
	return agent.E(agent.KindNotFound, agent.CodeJobNotFound, "job %s of thread %q not found", id, threadID)
}

// CreateJob is insert-then-verify (insertChild): one PutItem of the head (after the chunks of a large input),
// condition attribute_not_exists(pk), carrying createId, then one GetItem of the thread; a missing or tombstoned
// thread takes the job back and answers not found. An existing job is returned as stored.
func (s *Store) CreateJob(ctx context.Context, j agent.Job) (agent.Job, bool, error) {
	if err := j.Check(); err != nil {
		return agent.Job{}, false, err
	}
	pk := threadPK(j.ThreadID)
	head := jobItem(j)
	head[attrCreateID] = avS(s.ids.New("c"))
	if err := guardSize(head, maxChildFieldBytes, "job"); err != nil {
		return agent.Job{}, false, err
	}
	chunks, err := s.packValue(inputBlob, head, pk, jobChunkSK(j.ID), j.Input)
	if err != nil {
		return agent.Job{}, false, err
	}
	stored, mine, _, err := s.insertChild(ctx, childInsert{threadID: j.ThreadID, head: head, chunks: chunks,
		callAttr: attrCreateID, what: "job"})
	if err != nil {
		return agent.Job{}, false, err
	}
	if mine {
		got := decodeJobFields(head)
		got.Input = j.Input
		return got, true, nil
	}
	got, err := s.loadJob(ctx, stored, j.ThreadID, j.ID)
	return got, false, err
}

// GetJob is one strongly consistent GetItem (plus one BatchGetItem when a value is chunked).
func (s *Store) GetJob(ctx context.Context, threadID, id string) (agent.Job, error) {
	base := s.readBase(ctx, threadID)
	head, err := s.getItem(ctx, key(threadPK(threadID), jobSK(id)))
	if err != nil {
		return agent.Job{}, err
	}
	if kept, err := base.keep([]item{head}, attrEpoch); err != nil {
		return agent.Job{}, err
	} else if len(kept) == 0 {
		head = nil // of an earlier incarnation of the thread
	}
	if head == nil {
		return agent.Job{}, jobNotFound(threadID, id)
	}
	return s.loadJob(ctx, head, threadID, id)
}

// ListJobs is one Query over the thread's JOB# heads (plus one BatchGetItem for chunked values), ordered by
// creation, then id.
func (s *Store) ListJobs(ctx context.Context, threadID string) ([]agent.Job, error) {
	base := s.readBase(ctx, threadID)
	var heads []item
	if err := s.queryPrefix(ctx, threadPK(threadID), prefixJob, false, func(it item) error {
		heads = append(heads, it)
		return nil
	}); err != nil {
		return nil, err
	}
	heads, err := base.keep(heads, attrEpoch)
	if err != nil {
		return nil, err
	}
	out, err := s.loadJobs(ctx, heads)
	if err != nil {
		return nil, err
	}
	sortChildren(out, func(j agent.Job) (time.Time, string, string) { return j.CreatedAt, j.ThreadID, j.ID })
	return out, nil
}

// ListJobsPage reads the threadJobs index, keys only (eventually consistent, as every GSI read): one Query for the
// thread's running jobs ("R#<pk>", all of them: a user's active jobs are leased, so they are few), one for its
// newest delivered ones ("F#<pk>", newest first, Limit finished) and, when that one is full, one Select COUNT over
// the delivered ones for Omitted
// (keys-only index entries of ~100 bytes: 4 KB of them per read unit). Then one strongly consistent BatchGetItem
// of the heads it shows (plus one for chunked values): the jobs are shown as stored, whatever the index said. A
// job the index does not hold yet (created a moment ago) is missing until it catches up (dynalite's is
// synchronous); a job created before the index existed is not listed here (ListJobs lists it).
func (s *Store) ListJobsPage(ctx context.Context, threadID string, finished int) (agent.JobsPage, error) {
	base := s.readBase(ctx, threadID)
	pk := threadPK(threadID)
	var keys []item
	seen := map[string]bool{}
	collect := func(it item) error {
		// A job delivered between the two queries is in both (running, then delivered): BatchGetItem refuses a
		// list with a key twice (ValidationException, a 500 for the thread view).
		pk, sk := getS(it, AttrPK), getS(it, AttrSK)
		if !seen[pk+"\x00"+sk] {
			seen[pk+"\x00"+sk] = true
			keys = append(keys, key(pk, sk))
		}
		return nil
	}
	if err := s.queryJobOrder(ctx, jobRunningOrder+pk, 0, collect); err != nil {
		return agent.JobsPage{}, err
	}
	var page agent.JobsPage
	if finished > 0 {
		shown := 0
		err := s.queryJobOrder(ctx, jobDeliveredOrder+pk, finished, func(it item) error {
			shown++
			return collect(it)
		})
		if err != nil {
			return agent.JobsPage{}, err
		}
		if shown == finished {
			total, err := s.countJobOrder(ctx, jobDeliveredOrder+pk)
			if err != nil {
				return agent.JobsPage{}, err
			}
			page.Omitted = max(total-shown, 0)
		}
	} else {
		total, err := s.countJobOrder(ctx, jobDeliveredOrder+pk)
		if err != nil {
			return agent.JobsPage{}, err
		}
		page.Omitted = total
	}
	got, err := s.batchGet(ctx, keys)
	if err != nil {
		return agent.JobsPage{}, err
	}
	heads := make([]item, 0, len(got))
	for _, it := range got {
		heads = append(heads, it)
	}
	if heads, err = base.keep(heads, attrEpoch); err != nil {
		return agent.JobsPage{}, err
	}
	if page.Jobs, err = s.loadJobs(ctx, heads); err != nil {
		return agent.JobsPage{}, err
	}
	sortChildren(page.Jobs, func(j agent.Job) (time.Time, string, string) { return j.CreatedAt, j.ThreadID, j.ID })
	return page, nil
}

// queryJobOrder queries the threadJobs index for one partition (a state and a thread): oldest first, or newest
// first with at most limit (> 0) entries (one page: the query stops at the limit-th).
func (s *Store) queryJobOrder(ctx context.Context, partition string, limit int, fn func(item) error) error {
	e := newExpr()
	in := &dynamodb.QueryInput{IndexName: aws.String(IndexThreadJobs),
		KeyConditionExpression: aws.String(e.n(AttrJobThread) + " = " + e.v(avS(partition)))}
	if limit > 0 {
		in.ScanIndexForward, in.Limit = aws.Bool(false), aws.Int32(int32(limit))
	}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	seen := 0
	return s.query(ctx, in, func(it item) error {
		if err := fn(it); err != nil {
			return err
		}
		if seen++; seen == limit {
			return errStopQuery
		}
		return nil
	})
}

// countJobOrder counts one threadJobs partition (Select COUNT: the entries are read, none sent).
func (s *Store) countJobOrder(ctx context.Context, partition string) (int, error) {
	e := newExpr()
	in := &dynamodb.QueryInput{TableName: aws.String(s.table), IndexName: aws.String(IndexThreadJobs),
		KeyConditionExpression: aws.String(e.n(AttrJobThread) + " = " + e.v(avS(partition))), Select: types.SelectCount}
	in.ExpressionAttributeNames, in.ExpressionAttributeValues = e.attrNames(), e.attrValues()
	n := 0
	p := dynamodb.NewQueryPaginator(s.client, in)
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			return 0, storeErr(err, "count jobs")
		}
		n += int(out.Count)
	}
	return n, nil
}

// SetJobActivity is one UpdateItem on the job head, condition attribute_exists(pk) AND
// attribute_not_exists(finishedAt): SET activity (REMOVE it when empty), updatedAt. The failure's item (or one
// GetItem) tells an unknown job from a finished one.
func (s *Store) SetJobActivity(ctx context.Context, threadID, id, activity string, now time.Time) error {
	k := key(threadPK(threadID), jobSK(id))
	e := newExpr()
	update := "SET " + e.n(attrUpdatedAt) + " = " + e.v(avT(now))
	if activity = truncateUTF8(activity, maxJobTextBytes); activity != "" {
		update += ", " + e.n(attrActivity) + " = " + e.v(avS(activity))
	} else {
		update += " REMOVE " + e.n(attrActivity)
	}
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String("attribute_exists(" + e.n(AttrPK) + ") AND attribute_not_exists(" + e.n(attrFinishedAt) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if !isConditionFailed(err) {
		return storeErr(err, "set job activity")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if len(old) == 0 {
		return jobNotFound(threadID, id)
	}
	return agent.E(agent.KindConflict, agent.CodeJobFinished, "job %s has finished: its activity is final", id)
}

// SetJobDue is one UpdateItem on the job head, condition attribute_exists(pk) AND
// attribute_not_exists(finishedAt): SET dueAt (which moves the job within the dueWork index), updatedAt. The
// failure's item (or one GetItem) tells an unknown job from a finished one.
func (s *Store) SetJobDue(ctx context.Context, threadID, id string, due, now time.Time) error {
	k := key(threadPK(threadID), jobSK(id))
	e := newExpr()
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String("SET " + e.n(AttrDueAt) + " = " + e.v(avT(due)) + ", " + e.n(attrUpdatedAt) + " = " + e.v(avT(now))),
		ConditionExpression:                 aws.String("attribute_exists(" + e.n(AttrPK) + ") AND attribute_not_exists(" + e.n(attrFinishedAt) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if !isConditionFailed(err) {
		return storeErr(err, "set job due")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return err
	}
	if len(old) == 0 {
		return jobNotFound(threadID, id)
	}
	return agent.E(agent.KindConflict, agent.CodeJobFinished, "job %s has finished: its deadline is its delivery's", id)
}

// FinishJob is the compare-and-set, one UpdateItem on the job head:
//
//	condition: attribute_exists(pk) AND attribute_not_exists(finishedAt)
//	update:    SET finishedAt = :now, updatedAt = :now, dueAt = :due, outcome = done|error, finishId = :call
//	               [, jobError | respBody | respVer, respChunks [, respEnc]]
//	returns:   ALL_NEW; on a failed condition ALL_OLD
//
// The new dueAt moves the job within the dueWork index (from its execution's deadline to its delivery grace). The
// failure's item (or one GetItem) tells not found from finished, and a finished job is returned as stored; a
// failure on a head carrying our own finishId is this very finish, applied by an attempt whose answer was lost,
// and it answers stored = true. A large result has its chunks written first; a refused write deletes them unless
// the stored head is our own lost attempt.
func (s *Store) FinishJob(ctx context.Context, r agent.JobResult) (agent.Job, bool, error) {
	if err := r.Check(); err != nil {
		return agent.Job{}, false, err
	}
	pk := threadPK(r.ThreadID)
	k := key(pk, jobSK(r.ID))
	vals := item{}
	chunks, err := s.packValue(responseBlob, vals, pk, jobChunkSK(r.ID), r.Result)
	if err != nil {
		return agent.Job{}, false, err
	}
	outcome := agent.JobDone
	if r.Error != "" {
		outcome = agent.JobError
		vals[attrJobError] = avS(truncateUTF8(r.Error, maxJobTextBytes))
	}
	if r.Usage != (agent.Usage{}) {
		u, _ := json.Marshal(r.Usage)
		vals[attrJobUsage] = avS(string(u))
	}
	if err := s.writeChunks(ctx, packed{chunks: chunks}); err != nil {
		return agent.Job{}, false, err
	}
	call := s.ids.New("f")
	e := newExpr()
	sets := []string{
		e.n(attrFinishedAt) + " = " + e.v(avT(r.Now)),
		e.n(attrUpdatedAt) + " = " + e.v(avT(r.Now)),
		e.n(AttrDueAt) + " = " + e.v(avT(r.DueAt)),
		e.n(attrOutcome) + " = " + e.v(avS(string(outcome))),
		e.n(attrFinishID) + " = " + e.v(avS(call)),
	}
	fixed := len(sets)
	for a, v := range vals {
		sets = append(sets, e.n(a)+" = "+e.v(v))
	}
	sort.Strings(sets[fixed:]) // a stable request, for people reading logs
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String("SET " + strings.Join(sets, ", ")),
		ConditionExpression:                 aws.String("attribute_exists(" + e.n(AttrPK) + ") AND attribute_not_exists(" + e.n(attrFinishedAt) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		got, err := s.loadJob(ctx, res.Attributes, r.ThreadID, r.ID)
		return got, err == nil, err
	}
	if !isConditionFailed(err) {
		return agent.Job{}, false, storeErr(err, "finish job")
	}
	old, err := s.failedItem(ctx, err, k)
	if err != nil {
		return agent.Job{}, false, err
	}
	mine := len(old) > 0 && getS(old, attrFinishID) == call
	if !mine {
		s.dropItems(ctx, chunks) // ours, and no head points at them
	}
	if len(old) == 0 {
		return agent.Job{}, false, jobNotFound(r.ThreadID, r.ID)
	}
	got, err := s.loadJob(ctx, old, r.ThreadID, r.ID)
	return got, mine && err == nil, err
}

// MarkJobDelivered is one UpdateItem on the job head:
//
//	condition: attribute_exists(finishedAt) AND attribute_not_exists(steerDelivered)
//	update:    SET steerDelivered = true, status = outcome, updatedAt = :now REMOVE dueShard, dueAt
//	returns:   ALL_NEW; on a failed condition ALL_OLD
//
// status = outcome copies the status the finish chose (done, or error for a failure), so the delivery needs no
// read first. Removing the index keys takes the job out of dueWork in the same write. The failure's item (or one
// GetItem) tells an unknown job (not found), an unfinished one (job_not_finished) and a delivered one, which is
// returned unchanged.
func (s *Store) MarkJobDelivered(ctx context.Context, threadID, id string, now time.Time) (agent.Job, error) {
	k := key(threadPK(threadID), jobSK(id))
	e := newExpr()
	update := "SET " + e.n(attrSteerDelivered) + " = " + e.v(avBool(true)) + ", " + e.n(attrStatus) + " = " +
		e.n(attrOutcome) + ", " + e.n(attrUpdatedAt) + " = " + e.v(avT(now)) +
		", " + e.n(AttrJobThread) + " = " + e.v(avS(jobDeliveredOrder+threadPK(threadID))) +
		" REMOVE " + e.n(AttrDueShard) + ", " + e.n(AttrDueAt)
	res, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 k,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String("attribute_exists(" + e.n(attrFinishedAt) + ") AND attribute_not_exists(" + e.n(attrSteerDelivered) + ")"),
		ExpressionAttributeNames:            e.attrNames(),
		ExpressionAttributeValues:           e.attrValues(),
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return s.loadJob(ctx, res.Attributes, threadID, id)
	}
	if !isConditionFailed(err) {
		return agent.Job{}, storeErr(err, "mark job delivered")
	}
	old, err := s.failedItem(ctx, err, k)
	switch {
	case err != nil:
		return agent.Job{}, err
	case len(old) == 0:
		return agent.Job{}, jobNotFound(threadID, id)
	case !has(old, attrFinishedAt):
		return agent.Job{}, agent.E(agent.KindConflict, agent.CodeJobNotFinished, "job %s has not finished: nothing to deliver", id)
	}
	return s.loadJob(ctx, old, threadID, id) // delivered already
}

// ListDueJobs reads the sparse dueWork index, keys only: one Query per job shard (16) for dueAt < :before. Only
// undelivered jobs carry the index keys, so delivered ones cost the read nothing. The nominees are then read from
// the table with strongly consistent BatchGetItem requests (one per 100, plus one for chunked values) and only
// those still undelivered and due before `before` are returned: a delivery is never undone by a lagging index,
// while a job created or finished a moment ago may be missing (or still at its old deadline) until DynamoDB's
// index catches up (dynalite's is synchronous). Results are ordered by DueAt, then thread and id.
func (s *Store) ListDueJobs(ctx context.Context, before time.Time, limit int) ([]agent.Job, error) {
	if limit <= 0 {
		limit = agent.DefaultListLimit
	}
	out := []agent.Job{}
	ix := sparseIndex{name: IndexDueWork, shardAttr: AttrDueShard, shardPrefix: prefixJob, sortAttr: AttrDueAt,
		shards: DefaultDueShards, exact: true}
	err := s.nominate(ctx, ix, before, limit, func(nominees []item) (int, error) {
		got, err := s.batchGet(ctx, nominees)
		if err != nil {
			return 0, err
		}
		var heads []item
		for _, it := range got {
			if has(it, AttrDueAt) && !getBool(it, attrSteerDelivered) && getT(it, AttrDueAt).Before(before) {
				heads = append(heads, it)
			}
		}
		list, err := s.loadJobs(ctx, heads)
		out = append(out, list...)
		return len(list), err
	})
	if err != nil {
		return nil, err
	}
	sortChildren(out, func(j agent.Job) (time.Time, string, string) { return j.DueAt, j.ThreadID, j.ID })
	return out[:min(len(out), limit)], nil
}
