// Package chaos is the chaos soak of `agentloop dev` (make soak-chaos; never part of make test): the real binary
// on its SQLite file, SIGKILLed every 2–6 s (seeded) and restarted on the same port and data directory, while 12
// clients of one user each send messages in a thread of their own. It runs once with the default per-user limits
// and once with them off, then checks what the store kept, and prints one table.
//
// # Clients
//
// A client sends one message at a time (POST /chat, submit-message, ids its own): mostly a short echo, sometimes
// `/tool list_notes {}` (a tool call and a second model request) or `/slow 10` (a one-second reply, the likeliest
// to be cut by a kill). It reads the reply to its end, then waits 100–400 ms. A refusal (429, 409 run_active) or a
// refused connection is retried with the same message after 250–750 ms, whatever Retry-After says (a busy
// client, as in the review's measurement); a reply cut by a kill is posted again with the same id (a client's
// retry after a lost answer: DESIGN principle 3), and 409 duplicate_message then means the message was stored and
// answered (by the reaper's failed reply) and the client goes on. At the end of the duration, a client abandons
// the message it has not had accepted.
//
// # The check
//
// After the last restart the harness waits until every thread's run has ended (the reaper's stale window and one
// of its passes, at most SettleTimeout), then:
//   - every message a client had accepted (200, or 409 duplicate_message) is stored exactly once, in the order
//     sent; a message never accepted is stored at most once; nothing else is stored as a user message;
//   - every stored user message is followed by an assistant reply (a dead run's is a visible failed one);
//   - every run of every thread has ended;
//   - each thread answers one final message (`/slow 20`) with a completed reply, sent four threads at once (the
//     default run limit) with four readers on each run (the default reader limit per user, 16): nothing else
//     runs by then, so a 429 too_many_runs or too_many_streams is a slot or a reader lease that a dead run still
//     holds after it was reaped.
//
// A thread whose every message was refused was never created, and is not checked.
//
// # Settings
//
//	CHAOS_DURATION   how long each mode runs (the test is skipped when unset); make soak-chaos: 60s
//	CHAOS_MODES      default,off (the default) or one of them
//	CHAOS_CLIENTS    concurrent clients of the one user (12)
//	CHAOS_KILLS      off: no kills (the same load, for a baseline)
//	CHAOS_BIN        an agentloop binary to soak instead of this tree's (another commit's, for a before/after)
//	CHAOS_SEED       the seed of the kill schedule and the clients' choices (random, printed, when unset)
//
// Every other variable of the harness's environment reaches the server (AGENT_STALE_AFTER=5s shortens the stale
// window, for instance), except the per-user limits, which each mode sets. The servers' logs are kept in a
// directory the test prints, and removed when the check passes.
package chaos
